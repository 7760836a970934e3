"""Typed events: what the engine's log, HTTP probes and NVML tell the supervisor.

This module is the contract between the log parser (`logwatch`), the simulator's tests and the
policy state machine (`policy`). Events are plain frozen data; nothing here does I/O.

`rank` is the log prefix that identified the emitting process (``"TP0"``, ``"TP1"``, ``"DP0 TP1"``)
or ``None`` for lines without a prefix (tp=1, the main process, the detokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

GraphOwner = Literal["target", "draft"]
# "legacy" is the <=0.5.13 decode graph ("Capture cuda graph begin"); "piecewise" its prefill graph.
GraphPhase = Literal["prefill", "decode", "verify", "extend", "legacy", "piecewise"]


class FailureClass(str, Enum):
    """Why an engine start or run failed. Values are stable: they appear in logs, metrics, JSON."""

    UNKNOWN_FLAG = "unknown_flag"  # argparse rejected the command line (rc 2)
    # SGLang refused a flag on this machine and named it ("Please try removing --X argument"):
    # the command parses, but this GPU or build cannot run it
    FLAG_REFUSED = "flag_refused"
    CAPTURE_OOM = "capture_oom"  # decode/verify/draft CUDA graph capture ran out of memory
    CAPTURE_FAILED = "capture_failed"  # decode/verify/draft capture failed for another reason
    DRAFT_CAPTURE_FAILED = "draft_capture_failed"  # a draft-model graph capture failed
    PREFILL_GRAPH_FAILED = "prefill_graph_failed"  # breakable/piecewise prefill graph failed
    KV_CACHE_OOM = "kv_cache_oom"  # the KV pool does not fit
    SCHEDULER_DIED = "scheduler_died"  # a rank died during init (e.g. OOM killer)
    WARMUP_FAILED = "warmup_failed"  # failure after HTTP up, before the ready line
    WATCHDOG_TIMEOUT = "watchdog_timeout"  # SGLang's own scheduler watchdog fired
    NCCL_TIMEOUT = "nccl_timeout"  # collective operation timeout
    SCHEDULER_EXCEPTION = "scheduler_exception"  # "Scheduler hit an exception" without a finer class
    CHILD_CRASHED = "child_crashed"  # a subprocess crashed after startup
    CUDA_ERROR = "cuda_error"  # CUDA error / illegal memory access
    HANG = "hang"  # no log progress past the stall timeout (supervisor's own verdict)
    WEDGED = "wedged"  # alive but not serving: health/probe timeouts (supervisor's own verdict)
    PORT_IN_USE = "port_in_use"  # the engine could not bind its port
    GPU_BUSY = "gpu_busy"  # a foreign process holds the GPU memory we need
    # The host lacks something every profile needs (a build tool a JIT compile calls, e.g.
    # ninja): no profile is to blame and no other profile can help
    ENVIRONMENT = "environment"
    # The engine serves, but its greedy outputs or teacher-forced log-probs disagree with the
    # model's fidelity reference, or its speculative acceptance collapsed (core/fidelity.py):
    # deterministic for the command (supervisor's own verdict)
    OUTPUT_MISMATCH = "output_mismatch"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """Base of everything parsed from one engine log line."""

    line_no: int  # 1-based line number in the engine's output (after splitting on \n and \r)
    rank: str | None


@dataclass(frozen=True, slots=True)
class ServerArgsSeen(EngineEvent):
    """`server_args=...` dump. `args` holds the values parsed from it (secrets redacted)."""

    args: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeprecatedFlag(EngineEvent):
    flag: str
    replacement: str | None


@dataclass(frozen=True, slots=True)
class WeightsLoadBegan(EngineEvent):
    avail_mem_gb: float | None


@dataclass(frozen=True, slots=True)
class WeightsLoaded(EngineEvent):
    elapsed_s: float | None
    mem_usage_gb: float | None


@dataclass(frozen=True, slots=True)
class KVCacheAllocated(EngineEvent):
    tokens: int | None


@dataclass(frozen=True, slots=True)
class CaptureBegan(EngineEvent):
    owner: GraphOwner
    phase: GraphPhase
    backend: str | None


@dataclass(frozen=True, slots=True)
class CaptureEnded(EngineEvent):
    owner: GraphOwner
    phase: GraphPhase
    elapsed_s: float | None
    mem_usage_gb: float | None


@dataclass(frozen=True, slots=True)
class CaptureProgress(EngineEvent):
    """A `\\r`-redrawn progress frame: the engine is alive and moving."""

    what: str


@dataclass(frozen=True, slots=True)
class PrefillGraphDisabled(EngineEvent):
    reason: str


@dataclass(frozen=True, slots=True)
class SchedulerReady(EngineEvent):
    """`max_total_num_tokens=..., max_running_requests=..., context_len=...` (TP0)."""

    max_total_num_tokens: int | None
    max_running_requests: int | None
    context_len: int | None


@dataclass(frozen=True, slots=True)
class HttpUp(EngineEvent):
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ServerReady(EngineEvent):
    """`The server is fired up and ready to roll!`"""


@dataclass(frozen=True, slots=True)
class DecodeStats(EngineEvent):
    running_req: int | None
    queue_req: int | None
    gen_throughput: float | None
    cuda_graph: bool | None
    accept_len: float | None


@dataclass(frozen=True, slots=True)
class PrefillStats(EngineEvent):
    running_req: int | None
    queue_req: int | None
    input_throughput: float | None
    cuda_graph: bool | None


@dataclass(frozen=True, slots=True)
class Draining(EngineEvent):
    """SIGTERM received / gracefully exiting."""


@dataclass(frozen=True, slots=True)
class EngineFailed(EngineEvent):
    """A failure signature. The first one of a start is usually the cause; later ones are fallout."""

    failure: FailureClass
    message: str
    # A worker node's report on the group link, not a line of this host's engine: evidence that
    # node gives, which alone may restart the group but not mark a profile known-bad.
    node: int | None = None


@dataclass(frozen=True, slots=True)
class EngineCrashed(EngineEvent):
    """A child process of the engine died (`Subprocess ... crashed`, `SIGQUIT received`...)."""

    message: str


@dataclass(frozen=True, slots=True)
class LogOnStdout(EngineEvent):
    """SGLang's own start-up lines came on its stdout while nothing was parsed from its stderr:
    its log was sent to stdout (a logging config of the user's), so no start is ever seen."""


@dataclass(frozen=True, slots=True)
class TracebackLine(EngineEvent):
    """Part of a Python traceback or an error text: forwarded at error priority."""

    text: str
