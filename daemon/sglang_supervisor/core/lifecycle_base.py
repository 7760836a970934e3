"""The lifecycle's state and the steps every part of it takes: launch, stop, exit, phase, status.

`Lifecycle` (lifecycle.py) is assembled from parts that each own one kind of input (starting,
serving, temporary waits); they share this base. Pure: no I/O, no clock (time is an argument).
"""

from __future__ import annotations

from typing import Any

from sglang_supervisor.core.actions import (
    Action,
    CancelTimer,
    Exit,
    Launch,
    Log,
    LogLevel,
    NotifyStatus,
    StopEngine,
)
from sglang_supervisor.core.attempt import Attempt, AttemptRecord
from sglang_supervisor.core.canary import CanaryPlan
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.failover import ladder_order, skipped_known_bad
from sglang_supervisor.core.inputs import (
    FAILURE_GRACE_TIMER,
    STALL_TIMER,
    START_TIMER,
    Settings,
)
from sglang_supervisor.core.liveness import launch_timers
from sglang_supervisor.core.logwatch import redact
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.core.reasons import Outcome, StopReason

# Passive tok/s (Decode batch lines: several a second under load) refreshes STATUS= at most this
# often; a probe result always does.
STATUS_REFRESH_S = 5.0
FAILURE_LINE_CHARS = 300  # /status carries the failing line, bounded (a line may be a long traceback)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


class LifecycleBase:
    """One supervisor run's state. The run-wide facts live here; the current engine's facts in
    `self.cur`, an `Attempt` that each launch replaces whole."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.phase = Phase.PREFLIGHT
        self.cur = Attempt()
        self.attempts: list[AttemptRecord] = []
        self.tok_s: float | None = None
        self.ttft_s: float | None = None  # the last probe's time to first token
        self.ready_sent = False
        self.exit: Exit | None = None
        self._order = ladder_order(settings)
        self._skipped: dict[str, str] = skipped_known_bad(settings)
        self._probation: str | None = None  # the profile on probation, until READY or failure
        self._failed: set[str] = set()  # profiles that failed in this run
        self._crashes: dict[str, int] = {}  # crash-after-ready count per profile
        # Derived profiles of this run (and remembered ones), by name.
        self._derived: dict[str, Derivation] = dict(settings.derived)
        self._phase_since = 0.0
        self._tok_status_at = float("-inf")  # when STATUS= last showed a fresh tok/s
        # Waiting for a temporary condition: (class, detail, profile to relaunch or None for the
        # first), the wait's number, when the whole spell must end, temporary failures so far.
        self._waiting: tuple[FailureClass, str, str | None] | None = None
        self._wait_seq = 0
        self._temp_deadline: float | None = None
        self._temp_failures = 0
        self._gpu_busy_detail = "GPU held by a foreign process"
        # Armed by a reload that restarts a serving engine: the profile that served and the
        # settings it served under, until the new command is READY. One host's GPUs cannot hold
        # both engines, so "kept" means: put back and relaunched if the new command fails.
        self._rollback: tuple[str, Settings] | None = None
        # An upgrade canary under way (core/canary.py): judged at the candidate's READY probe.
        self._canary: CanaryPlan | None = None
        self._canary_reason = ""  # why the canary was rejected, for the rollback after its stop

    # -- public ---------------------------------------------------------------------------

    @property
    def rollback_to(self) -> str | None:
        """The profile a failing reloaded command would give way to, while one is armed."""
        return self._rollback[0] if self._rollback is not None else None

    @property
    def canary(self) -> CanaryPlan | None:
        """The upgrade canary under way (its candidate not judged yet), or None."""
        return self._canary

    @property
    def attempt(self) -> int:
        """The number of the current (or last) launch; 0 before the first."""
        return self.cur.number

    @property
    def profile(self) -> str | None:
        return self.cur.profile

    @property
    def wait_seq(self) -> int | None:
        """The number of the temporary wait under way (see WaitTemporary), or None."""
        return self._wait_seq if self._waiting is not None else None

    def snapshot(self, now: float) -> dict[str, Any]:
        """Status for `/status` and the demo summary (no secrets: names and numbers only)."""
        return {
            "phase": self.phase.value,
            "profile": self.profile,
            "attempt": self.attempt,
            "ready": self.phase in UP_PHASES,
            "tok_s": self.tok_s,
            "phase_seconds": round(now - self._phase_since, 3),
            "captures_expected": len(self.cur.expected),
            "captures_ended": self.cur.captures_done(),
            "failed_profiles": sorted(self._failed),
            "skipped_known_bad": dict(self._skipped),
            "derived_profiles": {n: d.to_json() for n, d in self._derived.items()},
            "waiting_for": ({"failure_class": self._waiting[0].value, "detail": self._waiting[1]}
                            if self._waiting is not None else None),
            "attempts": [
                {
                    "profile": a.profile,
                    "attempt": a.attempt,
                    "reason": a.reason,
                    "outcome": a.outcome.value,
                    "failure_class": a.failure_class.value if a.failure_class else None,
                    "failure_line": a.failure_line,
                    "seconds": a.seconds(now),
                }
                for a in self.attempts
            ],
        }

    def status_text(self) -> str:
        if self.phase == Phase.WAITING and self._waiting is not None:
            failure, detail, _ = self._waiting
            return (f"waiting: {failure.value}: {detail}; retrying when it clears, exit 75 after "
                    f"{self.settings.temporary_wait_s:g} s")
        parts = [self.phase.value]
        if self.profile:
            parts.append(f"profile={self.profile}")
            note = self._fallback_note() if self.phase in UP_PHASES else None
            if note:
                parts.append(note)
        if self.tok_s is not None:
            parts.append(f"tok/s={self.tok_s:.1f}")
        if self.cur.expected and self.phase == Phase.CAPTURING_GRAPHS:
            parts.append(f"graphs={self.cur.captures_done()}/{len(self.cur.expected)}")
        return " ".join(parts)

    def _fallback_note(self) -> str | None:
        """`(fallback from tuned: capture_oom)` while serving below the ladder's best profile:
        `systemctl status` alone tells a fallback from the intended profile, and why."""
        best = self.settings.profiles[0] if self.settings.profiles else None
        if best is None or self.profile == best:
            return None
        cause = next((a.failure_class.value for a in reversed(self.attempts)
                      if a.profile == best and a.failure_class is not None), None)
        if cause is None:
            cause = self._skipped.get(best)  # known bad from an earlier run, in its back-off
        return f"(fallback from {best}: {cause})" if cause else f"(fallback from {best})"

    # -- steps ----------------------------------------------------------------------------

    def _set_phase(self, phase: Phase, now: float) -> list[Action]:
        if phase == self.phase:
            return []
        self.phase = phase
        self._phase_since = now
        return [NotifyStatus(self.status_text())]

    def _record(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    def _seconds(self, now: float) -> float | None:
        rec = self._record()
        return rec.seconds(now) if rec is not None else None

    def _close_attempt(self, now: float, outcome: Outcome, failure: FailureClass | None) -> None:
        rec = self._record()
        if rec is not None:
            rec.close(now, outcome, failure)
            if failure is not None and rec.failure_line is None:
                # `sglang-supervisor status` shows it: the line of this class, else the first.
                lines = [f for f in self.cur.failures if f.failure == failure] or self.cur.failures
                if lines:
                    rec.failure_line = redact(lines[0].message)[:FAILURE_LINE_CHARS]  # keys SGLang prints

    def _exit(self, code: ExitCode, reason: str, now: float) -> list[Action]:
        self.exit = Exit(code, reason)
        acts: list[Action] = []
        if code == ExitCode.OK:
            acts += self._set_phase(Phase.STOPPED, now)
        else:
            acts += self._set_phase(Phase.FAILED, now)
        level: LogLevel = "info" if code == ExitCode.OK else "error"
        acts.append(Log("supervisor.exit", level, {"code": int(code), "reason": reason}))
        acts.append(self.exit)
        return acts

    def _stopped_by_signal(self, now: float) -> list[Action]:
        self._close_attempt(now, Outcome.STOPPED, None)
        return self._exit(ExitCode.OK, "stopped by signal", now)

    def _cancel_timers(self) -> list[Action]:
        return [CancelTimer(STALL_TIMER), CancelTimer(START_TIMER), CancelTimer(FAILURE_GRACE_TIMER)]

    def _launch(self, profile: str, reason: str, now: float, delay_s: float,
                restart: str | None = None) -> list[Action]:
        """Launch `profile` (a derived one is sent with its overlay, core/derive.py)."""
        self.cur = Attempt(number=self.cur.number + 1, profile=profile, engine_alive=True)
        self._waiting = None  # a launch (after the wait, or a reload) ends any wait
        self.attempts.append(AttemptRecord(profile, self.attempt, reason, started_at=now))
        acts: list[Action] = []
        acts += self._set_phase(Phase.LAUNCHING, now)
        acts.append(Log("engine.launch", "info",
                        {"profile": profile, "attempt": self.attempt, "reason": reason}))
        acts.append(Launch(profile, self.attempt, reason, delay_s, restart,
                           self._derived.get(profile)))
        acts += launch_timers(stall_s=self.settings.stall_s, start_s=self.settings.start_s,
                              delay_s=delay_s)
        return acts

    def _stop(self, reason: StopReason) -> list[Action]:
        if self.cur.stop_reason is not None:
            return []  # already stopping; the first reason decides what happens next
        self.cur.stop_reason = reason
        return [*self._cancel_timers(), Log("engine.stop", "info", {"profile": self.profile,
                                                                    "reason": reason.value}),
                StopEngine(reason)]

    def _excluded(self) -> set[str]:
        return self._failed | set(self._skipped)

    def _throughput(self, tok_s: float | None, now: float, *, force: bool) -> list[Action]:
        """A fresh tok/s figure. While up, STATUS= shows it (`systemctl status` is where an
        operator looks); passive figures at most every STATUS_REFRESH_S."""
        if tok_s is not None:
            self.tok_s = tok_s
        if self.phase not in UP_PHASES or (not force and now - self._tok_status_at < STATUS_REFRESH_S):
            return []
        self._tok_status_at = now
        return [NotifyStatus(self.status_text())]

    def _start(self, now: float) -> list[Action]:
        """Choose the first profile of the run (or again, after a wait before any launch)."""
        acts: list[Action] = []
        for name, cls in self._skipped.items():
            acts.append(Log("profile.known_bad_skipped", "warning",
                            {"profile": name, "failure_class": cls}))
        if self.settings.known_bad and not self._skipped and not self.settings.retry_known_bad:
            acts.append(Log("profile.known_bad_all", "warning", {
                "profiles": sorted(self.settings.known_bad),
                "hint": "every profile is known bad: trying them all again"}))
        first = next((p for p in self._order if p not in self._skipped), None)
        if first is None:  # unreachable while skipped_known_bad keeps one, kept for safety
            return acts + self._exit(ExitCode.ALL_PROFILES_FAILED, "no profile to start", now)
        reason = "last known good" if first == self.settings.last_good else "first profile"
        if first == self.settings.probation and self.settings.last_good is not None:
            self._probation = first
            reason = "probation"
            acts.append(Log("profile.probation", "warning", {
                "profile": first, "last_good": self.settings.last_good,
                "hint": "a better profile's back-off ended: trying it again; if it fails, back to "
                        "the last good profile at once"}))
        return acts + self._launch(first, reason, now, 0.0)
