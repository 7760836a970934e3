"""Every log message SGLang 0.3.0..0.5.23 can print in a category the supervisor acts on (the
catalogue scripts/gen-log-catalog extracted from the wheels) is read by the parser as that
category, or is listed in IGNORED with the reason it does not matter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    CaptureProgress,
    DecodeStats,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    FailureClass,
    KVCacheAllocated,
    PrefillStats,
    SchedulerReady,
    ServerReady,
    WeightsLoadBegan,
    WeightsLoaded,
)
from sglang_supervisor.core.logwatch import parse_lines

CATALOG = Path(__file__).resolve().parents[3] / "daemon" / "sglang_supervisor" / "engine" / "logcatalog.json"
DOC = json.loads(CATALOG.read_text(encoding="utf-8"))
HEADER = "[2025-06-01 12:00:00 TP0] "

# template -> why the parser does not (and need not) read it as its category.
IGNORED: dict[str, str] = {
    "Capture Frozen-KV MTP draft cuda graph begin.":
        "frozen-KV MTP draft graph: no profile fallback depends on it; its failure line is read",
    "Capture Frozen-KV MTP draft cuda graph end.": "see its begin line",
    "Capturing %d prefill CUDA graph token shapes with fixed max_context_size=%d "
    "(before execution variants).":
        "an informational count before the tqdm frames, not a progress frame",
    "MLX stub: initialized minimal pools (max_total_num_tokens={self.max_total_num_tokens}, "
    "max_running_requests={self.max_running_requests}, zero GPU KV cache allocation)":
        "Apple MLX stub, never on a GPU server; read as scheduler-ready all the same",
    "Using custom SIGQUIT handler: {cfg.custom_sigquit_handler}": "start-up notice, not a crash",
    "Using custom SIGQUIT handler: {server_args.custom_sigquit_handler}": "start-up notice, not a crash",
    "SIGTERM/SIGQUIT/Exception triggered, but crash dump already performed, skipping.":
        "follows a sigquit/SIGTERM line that is already read",
    "Signal handler is not added because the engine is not in the main thread. This disables the "
    "SIGQUIT handler for cleaning up the process tree when a child process fails.":
        "engine embedded in another program's thread: a warning, not a crash",
    "Received SIGQUIT from scheduler process. Scheduler failed, shutting down gRPC server.":
        "gRPC front end (not the HTTP server the supervisor runs)",
    "Initialization failed. Please see the error messages above.":
        "fallout: the cause is the error above it, which is read",
    "[unified-memory-pool]   total_bytes=%d (=%.2f GB), full_max_total_num_tokens=%d, "
    "swa_max_total_num_tokens=%d, joint_available=%d slots":
        "pool detail of hybrid (SWA/mamba) models; the scheduler's own max_total_num_tokens= line follows",
    "[unified-memory-pool]   total_bytes=%d, max_total_num_tokens=%d, max_mamba_cache_size=%d, "
    "max_num_reqs=%d, speculative_num_draft_tokens=%s":
        "pool detail of hybrid (SWA/mamba) models; the scheduler's own max_total_num_tokens= line follows",
    "Load weight end. Committed real weights after CUDA graph capture in %.2f s "
    "(capture overlap window %.2f s, startup overlap total %.2f s)":
        "overlapped weight loading (0.5.20+): the ordinary Load weight end line comes first",
}

CAPTURE_FAILS = {FailureClass.CAPTURE_FAILED, FailureClass.CAPTURE_OOM, FailureClass.DRAFT_CAPTURE_FAILED,
                 FailureClass.PREFILL_GRAPH_FAILED}
TRACEBACK = ('Traceback (most recent call last):\n  File "/sgl/srt/managers/scheduler.py", line 9, in run\n'
             "    self.event_loop()\nRuntimeError: boom")
# Sample values for the f-string fields of the templates, by the field's expression.
SAMPLES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"iter_msg"), ""),
    (re.compile(r"graph_backend\["), "npu graph"),  # `cuda graph` on NVIDIA/AMD, `npu graph` on Ascend
    (re.compile(r"'cuda graph'"), "cuda graph"),  # 0.5.3: `'cpu graph' if device == 'cpu' else ...`
    (re.compile(r"token_usage_msg|token_msg"), "#token: 5210, token usage: 0.02, "),
    (re.compile(r"graph$"), "True"),
    (re.compile(r"traceback"), TRACEBACK),
    (re.compile(r"^e$"), "CUDA out of memory. Tried to allocate 2.00 GiB"),
    (re.compile(r"capture_name"), "target decode"),
    (re.compile(r"debug_name"), "Scheduler"),
    (re.compile(r"_MSG$|failure_msg"), "Possible solutions: lower --mem-fraction-static"),
    (re.compile(r"quant_str"), ""),
    (re.compile(r"dtype"), "torch.bfloat16"),
    (re.compile(r"__name__"), "Qwen3ForCausalLM"),
    (re.compile(r"backend"), "full"),
    (re.compile(r"soft"), "False"),
    (re.compile(r"name$"), "scheduler_0"),
    (re.compile(r"exitcode"), "-9"),
    (re.compile(r"signum"), "3"),
    (re.compile(r"frame"), "None"),
]
FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
SPEC = re.compile(r":([<>^]?\d*(?:\.\d+)?[dfgs%]?)$")


def _value(expr: str, spec: str) -> str:
    for pattern, value in SAMPLES:
        if pattern.search(expr):
            return value
    if spec.endswith("f"):
        return format(12.34, spec)
    return "8"


def render(template: str) -> str:
    def field(m: re.Match[str]) -> str:
        if m.group(0) in ("{{", "}}"):
            return m.group(0)[0]
        expr = m.group(1)
        spec_m = SPEC.search(expr)
        spec = spec_m.group(1) if spec_m else ""
        return _value(expr[: spec_m.start()] if spec_m else expr, spec)

    text = FIELD.sub(field, template)
    if "{" not in template and "%" in text:  # logger's lazy %-formatting
        text = re.sub(r"%\.?\d*f", "12.34", re.sub(r"%[ds]", "8", text))
    return text


def lines_for(entry: dict[str, object]) -> list[str]:
    text = render(str(entry["template"]))
    level, cat = entry["level"], entry["category"]
    if level == "raise":  # the last line of a traceback
        return [*TRACEBACK.splitlines()[:-1], f"RuntimeError: {text}"]
    if level == "tqdm":  # a progress frame, printed without a log header
        return [f"{text}:  50%|█████     | 26/52 [00:05<00:05,  4.9it/s]"]
    if cat == "capture_failed":
        return [*TRACEBACK.splitlines()[:-1], f"RuntimeError: {text}"]
    first, *rest = text.split("\n")
    return [HEADER + first, *rest]


def expected(entry: dict[str, object], events: list[EngineEvent]) -> bool:
    cat = entry["category"]
    fails = [e.failure for e in events if isinstance(e, EngineFailed)]
    checks = {
        "ready": lambda: any(isinstance(e, ServerReady) for e in events),
        "scheduler_ready": lambda: any(isinstance(e, SchedulerReady) for e in events),
        "capture_begin": lambda: any(isinstance(e, CaptureBegan) for e in events),
        "capture_end": lambda: any(isinstance(e, CaptureEnded) for e in events),
        "capture_progress": lambda: any(isinstance(e, CaptureProgress) for e in events),
        "capture_failed": lambda: any(f in CAPTURE_FAILS for f in fails),
        "prefill_graph_failed": lambda: FailureClass.PREFILL_GRAPH_FAILED in fails,
        "weights_begin": lambda: any(isinstance(e, WeightsLoadBegan) for e in events),
        "weights_end": lambda: any(isinstance(e, WeightsLoaded) for e in events),
        "kv_cache": lambda: any(isinstance(e, KVCacheAllocated) for e in events),
        "decode_batch": lambda: any(isinstance(e, DecodeStats) and e.gen_throughput is not None
                                    and e.running_req == 8 for e in events),
        "prefill_batch": lambda: any(isinstance(e, PrefillStats) and e.running_req == 8 for e in events),
        "watchdog": lambda: FailureClass.WATCHDOG_TIMEOUT in fails,
        "sigquit": lambda: any(isinstance(e, EngineCrashed) for e in events),
        "exception": lambda: bool(fails),
        "kv_cache_oom": lambda: FailureClass.KV_CACHE_OOM in fails,
        "nccl_timeout": lambda: FailureClass.NCCL_TIMEOUT in fails,
        "init_failed": lambda: bool(fails),
    }
    return checks[str(cat)]()


MESSAGES = DOC["messages"]


def test_catalogue_covers_every_generation() -> None:
    versions = list(DOC["wheels"])
    assert versions[0] == "0.3.0" and versions[-1] == "0.5.23"
    assert {v.rsplit(".", 1)[0] for v in versions} == {"0.3", "0.4", "0.5"}
    for cat in ("ready", "capture_begin", "capture_end", "weights_begin", "decode_batch", "watchdog",
                "sigquit", "exception", "kv_cache_oom"):
        assert any(m["category"] == cat for m in MESSAGES), cat
    for version in versions:  # every release prints a ready line and a decode batch line
        assert any(m["category"] == "ready" and version in m["releases"] for m in MESSAGES), version
        assert any(m["category"] == "decode_batch" and version in m["releases"] for m in MESSAGES), version


@pytest.mark.parametrize("entry", MESSAGES, ids=[f"{m['category']}-{i}" for i, m in enumerate(MESSAGES)])
def test_every_catalogued_message_is_read_as_its_category(entry: dict[str, object]) -> None:
    template = str(entry["template"])
    events = parse_lines(lines_for(entry))
    if template in IGNORED:
        return
    assert expected(entry, events), (entry["category"], entry["releases"], lines_for(entry), events)


def test_ignored_entries_still_exist() -> None:
    """An IGNORED reason for a template no release prints any more is stale: remove it."""
    templates = {m["template"] for m in MESSAGES}
    assert set(IGNORED) - templates == set()
