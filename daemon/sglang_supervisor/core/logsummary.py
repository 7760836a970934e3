"""A whole log → what `logscan` prints: how far start-up got, the captures, the root failure and its
fix, the last throughput. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    DecodeStats,
    Draining,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    FailureClass,
    HttpUp,
    KVCacheAllocated,
    PrefillStats,
    SchedulerReady,
    ServerArgsSeen,
    ServerReady,
    WeightsLoadBegan,
    WeightsLoaded,
)
from sglang_supervisor.core.failures import root_of
from sglang_supervisor.engine import patterns as P

_CAPTURE_CLASSES = frozenset({
    FailureClass.CAPTURE_OOM, FailureClass.CAPTURE_FAILED, FailureClass.DRAFT_CAPTURE_FAILED,
    FailureClass.PREFILL_GRAPH_FAILED,
})


@dataclass(frozen=True)
class LogSummary:
    ready: bool
    phase: str
    tp_size: int | None
    capture: dict[str, Any]
    failure: dict[str, Any] | None
    crashed: bool
    last_gen_throughput: float | None
    last_input_throughput: float | None
    decode_cuda_graph: bool | None
    fix: str | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """Exactly the logscan JSON object of the issue."""
        return {
            "ready": self.ready,
            "phase": self.phase,
            "tp_size": self.tp_size,
            "capture": self.capture,
            "failure": self.failure,
            "crashed": self.crashed,
            "last_gen_throughput": self.last_gen_throughput,
            "last_input_throughput": self.last_input_throughput,
            "decode_cuda_graph": self.decode_cuda_graph,
        }


def root_failure(events: Sequence[EngineEvent]) -> EngineFailed | None:
    """The cause among the failure signatures (core/failures.root_of: the one ranker the daemon
    uses too)."""
    return root_of([e for e in events if isinstance(e, EngineFailed)],
                   [e.line_no for e in events if isinstance(e, EngineCrashed)])


# Lines only the scheduler / model runner print: with no rank prefix on them, tp_size is 1.
_SCHEDULER_EVENTS = (WeightsLoadBegan, WeightsLoaded, KVCacheAllocated, CaptureBegan, CaptureEnded,
                     SchedulerReady, DecodeStats, PrefillStats)

_PHASES = ("launching", "loading_weights", "capturing_graphs", "warming_up", "ready", "serving")


def summarize(events: Sequence[EngineEvent]) -> LogSummary:
    phase, ready, crashed = _progress(events)
    began, open_caps, cap_events = _captures(events)
    gen, inp, decode_graph = _throughput(events)
    root = root_failure(events)
    failed_capture = root is not None and (
        root.failure in _CAPTURE_CLASSES or (bool(open_caps) and not ready)
    )
    failure, fix = _failure(events, root, crashed)
    return LogSummary(
        ready=ready,
        phase=_PHASES[phase],
        tp_size=_tp_size(events),
        capture={"began": began, "completed": began and not open_caps, "failed": failed_capture,
                 "events": cap_events},
        failure=failure,
        crashed=crashed,
        last_gen_throughput=gen,
        last_input_throughput=inp,
        decode_cuda_graph=decode_graph,
        fix=fix,
    )


def _progress(events: Sequence[EngineEvent]) -> tuple[int, bool, bool]:
    """How far start-up got (an index of _PHASES), whether READY was printed, whether a process
    crashed outside a drain."""
    phase = 0
    ready = False
    draining = False
    crashed = False
    for e in events:
        if isinstance(e, (WeightsLoadBegan, WeightsLoaded, KVCacheAllocated)):
            phase = max(phase, 1)
        elif isinstance(e, CaptureBegan):
            phase = max(phase, 2)
        elif isinstance(e, (SchedulerReady, HttpUp)):
            phase = max(phase, 3)
        elif isinstance(e, ServerReady):
            phase = max(phase, 4)
            ready = True
        elif isinstance(e, DecodeStats):
            if ready:
                phase = max(phase, 5)
        elif isinstance(e, Draining):
            draining = True
        elif isinstance(e, EngineCrashed) and not draining:
            crashed = True
    return phase, ready, crashed


def _captures(
    events: Sequence[EngineEvent],
) -> tuple[bool, set[tuple[str, str, str | None]], list[dict[str, Any]]]:
    """Whether a capture began, the captures still open at the end, every begin and end in order."""
    cap_events: list[dict[str, Any]] = []
    open_caps: set[tuple[str, str, str | None]] = set()
    began = False
    for e in events:
        if isinstance(e, CaptureBegan):
            began = True
            open_caps.add((e.owner, e.phase, e.rank))
            cap_events.append({"kind": f"{e.owner} {e.phase}", "state": "begin", "rank": e.rank,
                               "elapsed_s": None})
        elif isinstance(e, CaptureEnded):
            open_caps.discard((e.owner, e.phase, e.rank))
            cap_events.append({"kind": f"{e.owner} {e.phase}", "state": "end", "rank": e.rank,
                               "elapsed_s": e.elapsed_s})
    return began, open_caps, cap_events


def _throughput(events: Sequence[EngineEvent]) -> tuple[float | None, float | None, bool | None]:
    """The last decode and prefill throughput seen, and whether decode last ran in a CUDA graph."""
    gen: float | None = None
    inp: float | None = None
    decode_graph: bool | None = None
    for e in events:
        if isinstance(e, DecodeStats):
            gen = e.gen_throughput if e.gen_throughput is not None else gen
            decode_graph = e.cuda_graph if e.cuda_graph is not None else decode_graph
        elif isinstance(e, PrefillStats):
            inp = e.input_throughput if e.input_throughput is not None else inp
    return gen, inp, decode_graph


def _tp_size(events: Sequence[EngineEvent]) -> int | None:
    """The dumped server_args' tp_size, else the highest `TP<n>` rank + 1, else 1 when scheduler
    lines carry no rank (SGLang prefixes them with a rank only when tp_size > 1)."""
    tp_size: int | None = None
    max_tp = -1
    unranked_scheduler = False
    for e in events:
        if e.rank is None and isinstance(e, _SCHEDULER_EVENTS):
            unranked_scheduler = True
        if e.rank and "TP" in e.rank:
            digits = e.rank.rsplit("TP", 1)[1].split()[0]
            if digits.isdigit():
                max_tp = max(max_tp, int(digits))
        if isinstance(e, ServerArgsSeen):
            raw = e.args.get("tp_size")
            if raw and raw.isdigit():
                tp_size = int(raw)
    if tp_size is None and max_tp >= 0:
        return max_tp + 1
    if tp_size is None and unranked_scheduler:
        return 1
    return tp_size


def _failure(
    events: Sequence[EngineEvent], root: EngineFailed | None, crashed: bool
) -> tuple[dict[str, Any] | None, str | None]:
    """The root failure and its fix; a crash with no cause printed is the failure we can name."""
    if root is not None:
        fix = (P.environment_fix(root.message) if root.failure is FailureClass.ENVIRONMENT
               else P.FIX_HINTS.get(root.failure))
        return ({"class": root.failure.value, "message": root.message, "line": root.line_no}, fix)
    if not crashed:
        return None, None
    # A sigquit / `Killed` with no cause printed: the crash is the failure we can name.
    first = next(e for e in events if isinstance(e, EngineCrashed))
    return ({"class": FailureClass.CHILD_CRASHED.value, "message": first.message, "line": first.line_no},
            P.FIX_HINTS[FailureClass.CHILD_CRASHED])
