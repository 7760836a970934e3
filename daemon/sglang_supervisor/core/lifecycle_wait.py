"""The lifecycle waiting for a temporary condition (port busy, GPU held by a stranger) to clear.

Not the profile's fault: the same profile (or the first, before any launch) again once it clears,
exit 75 when it does not within restart.temporary_wait_s over the whole spell. Systemd's start
limit would end the unit for good after a few quick 75s: waiting here keeps a port held for a
minute from needing a person.
"""

from __future__ import annotations

from sglang_supervisor.core.actions import Action, CancelTimer, Log, SetTimer, WaitTemporary
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.inputs import TEMPORARY_TIMER, GpuBusy, PortBusy, TemporaryCleared
from sglang_supervisor.core.lifecycle_base import LifecycleBase
from sglang_supervisor.core.phases import Phase
from sglang_supervisor.core.reasons import Outcome, StopReason

# Relaunches after the engine itself reported a temporary failure back off (restart.backoff_s,
# doubled each time) up to this; a wait found by our own checks relaunches as soon as it clears.
TEMPORARY_RETRY_MAX_S = 60.0


class WaitingLifecycle(LifecycleBase):
    def _on_gpu_busy(self, inp: GpuBusy, now: float) -> list[Action]:
        acts: list[Action] = [Log("gpu.busy", "error", {"detail": inp.detail})]
        self._gpu_busy_detail = f"GPU held by a foreign process: {inp.detail}"
        if self.cur.engine_alive:
            self.cur.stop_reason = None  # this stop overrides one under way
            return acts + self._stop(StopReason.GPU_BUSY)
        self._close_attempt(now, Outcome.FAILED, FailureClass.GPU_BUSY)
        return acts + self._wait_temporary(FailureClass.GPU_BUSY, self._gpu_busy_detail, now,
                                           self.profile, engine_said=False)

    def _on_port_busy(self, inp: PortBusy, now: float) -> list[Action]:
        if self.cur.engine_alive:  # only meaningful before a launch: the engine owns its port
            return []
        return [Log("engine.port_in_use", "error", {"detail": inp.detail}),
                *self._wait_temporary(FailureClass.PORT_IN_USE, f"engine port busy: {inp.detail}",
                                      now, self.profile, engine_said=False)]

    def _on_temporary_cleared(self, inp: TemporaryCleared, now: float) -> list[Action]:
        if self._waiting is None or inp.seq != self._wait_seq or self.cur.engine_alive:
            return []  # a wait that a launch (reload) or a stop already ended
        failure, _, profile = self._waiting
        self._waiting = None
        acts: list[Action] = [CancelTimer(TEMPORARY_TIMER),
                              Log("supervisor.wait_over", "info", {
                                  "failure_class": failure.value, "profile": profile})]
        if profile is None:
            return acts + self._start(now)
        acts += self._set_phase(Phase.RESTARTING, now)
        return acts + self._launch(profile, f"after {failure.value} cleared", now, 0.0,
                                   failure.value)

    def _on_temporary_timer(self, now: float) -> list[Action]:
        if self._waiting is None or self.cur.engine_alive:
            return []
        failure, detail, _ = self._waiting
        self._waiting = None
        return self._temporary_exit(failure, detail, now)

    def _temporary_exit(self, failure: FailureClass, detail: str, now: float) -> list[Action]:
        wait_s = self.settings.temporary_wait_s
        why = f" did not clear within {wait_s:g} s" if wait_s > 0 else ""
        return self._exit(ExitCode.TEMPORARY, f"{failure.value}{why}: {detail}", now)

    def _wait_temporary(self, failure: FailureClass, detail: str, now: float,
                        profile: str | None, *, engine_said: bool) -> list[Action]:
        """Wait (bounded by `temporary_wait_s` over the whole spell) for a temporary condition
        to clear, then relaunch `profile` (None: start the ladder); past the bound, exit 75."""
        if self._temp_deadline is None:
            self._temp_deadline = now + self.settings.temporary_wait_s
        left = self._temp_deadline - now
        if left <= 0:
            return self._temporary_exit(failure, detail, now)
        self._temp_failures += 1
        delay = (min(self.settings.backoff_s * 2 ** (self._temp_failures - 1),
                     TEMPORARY_RETRY_MAX_S) if engine_said else 0.0)
        self._wait_seq += 1
        self._waiting = (failure, detail, profile)
        acts: list[Action] = [Log("supervisor.waiting", "warning", {
            "failure_class": failure.value, "detail": detail, "profile": profile,
            "retry_after_s": delay, "exit_in_s": round(left, 3)})]
        acts += self._set_phase(Phase.WAITING, now)
        what = "port" if failure is FailureClass.PORT_IN_USE else "gpu"
        return [*acts, SetTimer(TEMPORARY_TIMER, left),
                WaitTemporary(what, detail, delay, self._wait_seq)]
