"""A running server's /server_info and metrics: resolved args, captured graphs, throughput, accept length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_supervisor.core.audit.findings import Finding, Severity
from sglang_supervisor.engine.api import CUDA_GRAPH_PASSES, DECODE_EAGER_MODE, SERVER_INFO_SECRET_KEYS
from sglang_supervisor.engine.sglang import (
    PER_PHASE_GRAPHS,
)


def redact_server_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """Copy of /server_info with secrets replaced (SGLang returns --api-key in clear)."""

    def scrub(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {k: ("<redacted>" if k in SERVER_INFO_SECRET_KEYS and v else scrub(v))
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [scrub(x) for x in obj]
        return obj

    out: dict[str, Any] = scrub(info)
    return out


def live_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    states = info.get("internal_states") or [{}]
    st = states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    mem = st.get("memory_usage") if isinstance(st.get("memory_usage"), Mapping) else {}
    return {
        "version": info.get("version"),
        "model_path": info.get("model_path"),
        "tp_size": info.get("tp_size"),
        "speculative_algorithm": info.get("speculative_algorithm"),
        "cuda_graph_backend_decode": info.get("cuda_graph_backend_decode"),
        "cuda_graph_backend_prefill": info.get("cuda_graph_backend_prefill"),
        "last_gen_throughput": st.get("last_gen_throughput"),
        "avg_spec_accept_length": st.get("avg_spec_accept_length"),
        "memory_usage": mem,
        "max_total_num_tokens": info.get("max_total_num_tokens"),
    }


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def live_findings(info: Mapping[str, Any], decode_none_passes: float | None = None) -> list[Finding]:
    """Evidence from a running server: resolved args, graph memory, throughput, accept length."""
    s = live_summary(info)
    return (_summary_findings(s) + _graph_findings(info, s) + _eager_pass_findings(decode_none_passes)
            + _accept_findings(s))


def _summary_findings(s: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    version = str(s["version"] or "?")
    thr = _num(s["last_gen_throughput"])
    out.append(
        Finding(
            "info",
            "live",
            f"sglang {version} serving {s['model_path']}: last gen throughput "
            + (f"{thr:.1f} tok/s" if thr is not None else "unknown"),
            "from /server_info internal_states[0]",
            "",
            "live.summary",
        )
    )
    return out


def _graph_findings(info: Mapping[str, Any], s: Mapping[str, Any]) -> list[Finding]:
    """Which graphs the running server resolved and captured (memory_usage.graph is the proof)."""
    mem = s["memory_usage"] or {}
    graph = mem.get("graph") if isinstance(mem.get("graph"), Mapping) else None
    spec = bool(s["speculative_algorithm"])
    return _piecewise_off(info) + _decode_graph(info, graph, spec) + _prefill_graph(graph)


def _piecewise_off(info: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    if info.get("disable_piecewise_cuda_graph") is True:  # <=0.5.13 resolved field
        out.append(
            Finding(
                "warning",
                "live",
                "the running server resolved disable_piecewise_cuda_graph=True",
                "one of SGLang's auto-disable rules (multimodal architecture, LoRA, PP, ...) turned the "
                "piecewise prefill graph off; doctor --config names the rule",
                f"--enforce-piecewise-cuda-graph before {PER_PHASE_GRAPHS}, --cuda-graph-backend-prefill "
                "breakable on newer",
                "live.piecewise_off",
            )
        )
    return out


def _decode_graph(info: Mapping[str, Any], graph: Mapping[str, Any] | None, spec: bool) -> list[Finding]:
    out: list[Finding] = []
    decode_disabled = (
        info.get("disable_cuda_graph") is True
        or info.get("disable_decode_cuda_graph") is True
        or info.get("cuda_graph_backend_decode") == "disabled"
    )
    decode_key = "target_verify" if spec else "decode"
    graph_mem = _num(graph.get(decode_key)) if graph else None
    if decode_disabled or (graph_mem is not None and graph_mem == 0.0):
        evidence = (
            "the resolved args disable it"
            if decode_disabled
            else f"memory_usage.graph.{decode_key} is 0 GB (no graph was captured)"
        )
        out.append(
            Finding(
                "warning",
                "live",
                "the running server decodes WITHOUT CUDA graphs",
                evidence,
                "remove the flag that disables decode graphs and restart (doctor --config shows which)",
                "live.decode_eager",
            )
        )
    elif graph_mem is not None:
        out.append(
            Finding(
                "ok",
                "live",
                f"{decode_key} CUDA graph captured ({graph_mem:.3f} GB)",
                "",
                "",
                "live.decode_graph",
            )
        )
    return out


def _prefill_graph(graph: Mapping[str, Any] | None) -> list[Finding]:
    out: list[Finding] = []
    if graph is not None:
        prefill_mem = _num(graph.get("prefill"))
        if prefill_mem == 0.0:
            out.append(
                Finding(
                    "warning",
                    "live",
                    "no prefill CUDA graph was captured",
                    "memory_usage.graph.prefill is 0 GB",
                    "see the audit's prefill graph finding",
                    "live.prefill_eager",
                )
            )
    return out


def _eager_pass_findings(decode_none_passes: float | None) -> list[Finding]:
    out: list[Finding] = []
    if decode_none_passes:
        out.append(
            Finding(
                "warning",
                "live",
                f"{decode_none_passes:.0f} decode passes ran eagerly",
                f"{CUDA_GRAPH_PASSES}{{mode={DECODE_EAGER_MODE}}} > 0: batches fell outside the "
                "captured sizes",
                "raise --cuda-graph-max-bs-decode to the concurrency you serve",
                "live.decode_none",
            )
        )
    return out


def _accept_findings(s: Mapping[str, Any]) -> list[Finding]:
    spec = bool(s["speculative_algorithm"])
    out: list[Finding] = []
    acc = _num(s["avg_spec_accept_length"])
    if spec and acc is not None:
        sev: Severity = "warning" if acc < 1.5 else "ok"
        out.append(
            Finding(
                sev,
                "live",
                f"speculative accept length {acc:.2f}",
                "below 1.5 the draft costs more than it saves"
                if sev == "warning"
                else "drafts are paying off",
                "fewer --speculative-num-steps or no speculation" if sev == "warning" else "",
                "live.spec_accept",
            )
        )
    return out
