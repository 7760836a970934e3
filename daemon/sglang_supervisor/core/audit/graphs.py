"""Which CUDA graphs a profile captures, as findings (the model itself is engine/graphs.py)."""

from __future__ import annotations

from sglang_supervisor.core.audit.findings import Finding, Severity
from sglang_supervisor.engine import patterns as P
from sglang_supervisor.engine.argv import Flags
from sglang_supervisor.engine.graphs import PhaseVerdict, graph_phases
from sglang_supervisor.engine.modelinfo import ModelInfo
from sglang_supervisor.engine.sglang import PER_PHASE_GRAPHS, at_least


def graph_findings(flags: Flags, version: str, model: ModelInfo | None, profile: str) -> list[Finding]:
    decode, prefill = graph_phases(flags, version, model)
    spec = flags.get("--speculative-algorithm") is not None
    return [_decode_finding(decode, spec, version, profile), _prefill_finding(prefill, version, profile)]


def _decode_finding(decode: PhaseVerdict, spec: bool, version: str, profile: str) -> Finding:
    dname = "decode (verify with speculative decoding)" if spec else "decode"
    if decode.on:
        return Finding(
            "ok",
            "audit",
            f"{dname} CUDA graph: on (backend {decode.backend})",
            f"no rule of sglang {version} disables it for this profile",
            "",
            "graph.decode.on",
            profile,
        )
    return Finding(
        "warning",
        "audit",
        f"{dname} CUDA graph: OFF",
        "because " + "; ".join(decode.reasons) + ". Every decode step then launches its "
        "kernels one by one: single-stream tok/s drops sharply.",
        decode.fix,
        "graph.decode.off",
        profile,
    )


def _prefill_finding(prefill: PhaseVerdict, version: str, profile: str) -> Finding:
    legacy = not at_least(version, PER_PHASE_GRAPHS)
    pname = "piecewise prefill CUDA graph" if legacy else "prefill CUDA graph"
    if prefill.on:
        why = "; ".join(prefill.reasons) or f"no auto-disable rule of sglang {version} matches this profile"
        sev: Severity = "ok" if prefill.certain else "info"
        extra = (
            ""
            if prefill.certain
            else f" (a runtime rule may still turn it off; watch for '{P.PREFILL_DISABLED_LINE}' in "
            "the log)"
        )
        return Finding(
            sev,
            "audit",
            f"{pname}: on (backend {prefill.backend})",
            why + extra,
            "",
            "graph.prefill.on",
            profile,
        )
    return Finding(
        "warning",
        "audit",
        f"{pname}: OFF",
        "because " + "; ".join(prefill.reasons) + ". Prefill (and time to first token) runs eagerly.",
        prefill.fix,
        "graph.prefill.off",
        profile,
    )
