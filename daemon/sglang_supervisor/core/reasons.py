"""Why the supervisor stopped an engine, how an attempt ended, why an engine was relaunched.

These used to be bare strings compared in several modules (a typo was a silent new reason). They
are `str` enums whose values are the old strings, so state files, JSON, log fields and metric
labels read exactly as before, and `str()`/f-strings give the value on every Python version (a
plain `(str, Enum)` formats as `StopReason.SIGNAL` on 3.11).
"""

from __future__ import annotations

from enum import Enum


class TextEnum(str, Enum):
    """A str enum that prints as its value (what `enum.StrEnum` does from 3.11 on)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class StopReason(TextEnum):
    """Why the lifecycle asked the engine to stop (`StopEngine.reason`)."""

    SIGNAL = "signal"  # SIGTERM/SIGINT to the supervisor: the run ends
    RELOAD = "reload"  # the rendered command changed: relaunch under the new configuration
    REGRESSION = "regression"  # the throughput monitor chose another (or the same) profile
    GPU_BUSY = "gpu_busy"  # a foreign process holds the GPU memory the engine needs
    HANG = "hang"  # no engine output for stall_s while starting
    START_TIMEOUT = "start_timeout"  # the whole start took longer than start_s
    WEDGED = "wedged"  # health checks or probes say it no longer serves
    PROBE_HUNG = "probe_hung"  # the ready probe timed out
    PROBE_FAILED = "probe_failed"  # the ready probe got an error
    CAPTURE_MISSING = "capture_missing"  # the ready line came before every expected capture
    FAILED = "failed"  # a fatal log line and the engine did not exit within failure_grace_s
    LOG_ON_STDOUT = "log_on_stdout"  # its log goes to stdout: no start can ever be seen
    CANARY = "canary_rejected"  # an upgrade candidate measured worse than the current release
    OUTPUT_MISMATCH = "output_mismatch"  # its outputs disagree with the fidelity reference

    @property
    def planned(self) -> bool:
        """A stop chosen while the engine serves well: it gets its full drain (and the gateway
        moves traffic away first). After a failure or a hang SIGTERM is a formality."""
        return self in PLANNED_STOPS


PLANNED_STOPS = frozenset({StopReason.SIGNAL, StopReason.RELOAD, StopReason.REGRESSION,
                           StopReason.CANARY})


class Outcome(TextEnum):
    """How one attempt (one engine launch) ended, in `/status` and the demo summary."""

    RUNNING = "running"
    READY = "ready"  # it reached READY (and keeps this outcome when later stopped on purpose)
    FAILED = "failed"  # it failed before READY
    CRASHED = "crashed"  # it failed after READY
    STOPPED = "stopped"  # we stopped it (signal, reload, regression) before READY


class RestartCause(TextEnum):
    """Restart reasons that are not failures; a relaunch after a failure carries its
    FailureClass value instead (`Launch.restart`, the restarts counter's `reason` label)."""

    REGRESSION = "regression"
    RELOAD = "reload"
    ROLLBACK = "rollback"  # a reloaded command failed before READY: the previous one again
