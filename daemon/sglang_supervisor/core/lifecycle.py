"""The lifecycle state machine: inputs in, actions out. Pure: no I/O, no clock, no randomness.

`Lifecycle.handle(input, now)` answers one input (inputs.py) with the actions (actions.py) the
shell carries out in order. The machine is assembled from parts that each own one kind of input:
lifecycle_start (the engine's log while it starts, the ready gate), lifecycle_serve (health,
probes, throughput, regression decisions), lifecycle_wait (temporary conditions); this module
owns the run itself: start, exits of the engine, failing over, timers, signals, reloads. The key
decisions are pure functions of their own: readiness.py, failover.py, regression_action.py,
wedge.py.
"""

from __future__ import annotations

from typing_extensions import assert_never

from sglang_supervisor.core.actions import (
    Action,
    Log,
    NotifyReady,
    NotifyReloading,
    NotifyStopping,
)
from sglang_supervisor.core.events import EngineEvent, FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.failover import (
    STOP_VERDICTS,
    ExitConfig,
    FallBack,
    GiveUp,
    Ladder,
    RetrySame,
    WaitThenSame,
    corroborated,
    decide_next_profile,
    ladder_order,
    reported_only,
    skipped_known_bad,
)
from sglang_supervisor.core.failures import classify_failure
from sglang_supervisor.core.inputs import (
    TEMPORARY_TIMER,
    DecodeProgress,
    EngineExited,
    FidelityFailed,
    GpuBusy,
    HealthFailed,
    HealthOk,
    Input,
    Launched,
    LaunchFailed,
    PassiveThroughput,
    PortBusy,
    ProbeFailed,
    ProbeOk,
    RegressionDecision,
    ReloadRequested,
    Start,
    StopRequested,
    TemporaryCleared,
    TimerFired,
)
from sglang_supervisor.core.lifecycle_change import ChangingLifecycle
from sglang_supervisor.core.lifecycle_serve import ServingLifecycle
from sglang_supervisor.core.lifecycle_start import StartingLifecycle
from sglang_supervisor.core.lifecycle_wait import WaitingLifecycle
from sglang_supervisor.core.liveness import timer_verdict
from sglang_supervisor.core.phases import FINAL_PHASES, UP_PHASES, Phase
from sglang_supervisor.core.readiness import FirstProbe
from sglang_supervisor.core.reasons import Outcome, RestartCause, StopReason
from sglang_supervisor.core.wedge import Check
from sglang_supervisor.engine import patterns as P


class Lifecycle(StartingLifecycle, ServingLifecycle, WaitingLifecycle, ChangingLifecycle):
    """One supervisor run. Feed `handle(input, now)`; carry out the returned actions in order."""

    def handle(self, inp: Input, now: float) -> list[Action]:
        """Every input type has its case: mypy proves the match exhaustive (`assert_never`),
        so a new input cannot be dropped by a forgotten handler."""
        if self.phase in FINAL_PHASES:
            return []
        match inp:
            case Start():
                return self._start(now)
            case Launched():
                return self._on_launched(inp)
            case LaunchFailed():
                return self._on_launch_failed(inp, now)
            case EngineExited():
                return self._on_engine_exited(inp, now)
            case TimerFired():
                return self._on_timer(inp, now)
            case ProbeOk():
                return self._on_probe_ok(inp, now)
            case ProbeFailed():
                return self._on_probe_failed(inp, now)
            case FidelityFailed():
                return self._on_fidelity_failed(inp, now)
            case PassiveThroughput():
                return self._throughput(inp.tok_s, now, force=False)
            case HealthOk():
                return self._judge(Check.HEALTH_OK, "", now)
            case HealthFailed():
                return self._judge(Check.HEALTH_FAILED, inp.reason, now)
            case DecodeProgress():
                self.cur.progress = True
                return []
            case StopRequested():
                return self._on_stop_requested(inp, now)
            case ReloadRequested():
                return self._on_reload(inp, now)
            case RegressionDecision():
                return self._on_regression(inp, now)
            case GpuBusy():
                return self._on_gpu_busy(inp, now)
            case PortBusy():
                return self._on_port_busy(inp, now)
            case TemporaryCleared():
                return self._on_temporary_cleared(inp, now)
            case EngineEvent():
                return self._on_engine_event(inp, now)
            case _:
                assert_never(inp)

    # -- probes: the first one gates READY, later ones judge a serving engine --------------

    def _on_probe_ok(self, inp: ProbeOk, now: float) -> list[Action]:
        if inp.tok_s is not None:
            self.tok_s = inp.tok_s
        if inp.ttft_s is not None:
            self.ttft_s = inp.ttft_s
        if self._first_probe(inp) is FirstProbe.READY:
            return self._ready(inp, now)
        return self._serving_probe_ok(inp, now)

    def _on_probe_failed(self, inp: ProbeFailed, now: float) -> list[Action]:
        verdict = self._first_probe(inp)
        if verdict in (FirstProbe.FAILED, FirstProbe.HUNG):
            return self._ready_probe_failed(inp, verdict)
        if verdict is FirstProbe.IGNORED:
            return []
        return self._serving_probe_failed(inp, now)

    # -- the engine ends ------------------------------------------------------------------

    def _on_launch_failed(self, inp: LaunchFailed, now: float) -> list[Action]:
        if inp.attempt != self.attempt:
            return []
        self.cur.engine_alive = False
        acts: list[Action] = list(self._cancel_timers())
        if inp.config_error:
            self._close_attempt(now, Outcome.FAILED, FailureClass.UNKNOWN_FLAG)
            acts.append(Log("engine.launch_failed", "error", {"profile": self.profile,
                                                               "message": inp.message}))
            if self._rollback is not None and self.cur.stop_reason is not StopReason.SIGNAL:
                return acts + self._roll_back(FailureClass.UNKNOWN_FLAG, inp.message, now)
            return acts + self._exit(ExitCode.CONFIG, inp.message, now)
        if self.cur.stop_reason is StopReason.SIGNAL:
            return acts + self._stopped_by_signal(now)
        return acts + self._fail_over(FailureClass.OTHER, inp.message, now, after_ready=False)

    def _on_engine_exited(self, inp: EngineExited, now: float) -> list[Action]:
        cur = self.cur
        if inp.attempt != self.attempt or not cur.engine_alive:
            return []
        cur.engine_alive = False
        acts: list[Action] = list(self._cancel_timers())
        # A version's clean codes (-9 up to 0.5.17) mean clean only after our own stop: the same
        # -9 unasked is a SIGKILL from elsewhere (OOM killer, a dying child's kill_process_tree).
        clean = inp.clean and (inp.we_stopped or inp.returncode == 0)
        acts.append(Log("engine.exited", "info" if inp.we_stopped else "warning", {
            "profile": self.profile, "attempt": inp.attempt, "returncode": inp.returncode,
            "we_stopped": inp.we_stopped, "clean": clean}))
        reason = cur.stop_reason
        if reason is StopReason.SIGNAL:
            return acts + self._stopped_by_signal(now)
        if reason is StopReason.LOG_ON_STDOUT:
            self._close_attempt(now, Outcome.FAILED, None)
            return acts + self._exit(ExitCode.CONFIG, "SGLang's log goes to stdout", now)
        if reason is StopReason.GPU_BUSY:
            self._close_attempt(now, Outcome.FAILED, FailureClass.GPU_BUSY)
            return acts + self._wait_temporary(FailureClass.GPU_BUSY, self._gpu_busy_detail, now,
                                               self.profile, engine_said=False)
        if reason is StopReason.CANARY and self._rollback is not None:
            # The candidate served but measured worse: the release that served comes back.
            self._close_attempt(now, Outcome.STOPPED, None)
            return acts + self._roll_back(StopReason.CANARY.value, self._canary_reason, now)
        if reason in (StopReason.RELOAD, StopReason.REGRESSION):
            self._close_attempt(now, Outcome.STOPPED, None)
            target = cur.next_profile or self.profile or self._order[0]
            acts += self._set_phase(Phase.RESTARTING, now)
            restart = RestartCause.RELOAD if reason is StopReason.RELOAD else RestartCause.REGRESSION
            return acts + self._launch(target, reason.value, now, self.settings.backoff_s,
                                       restart.value)
        failures, dropped = corroborated(
            cur.failures, returncode=inp.returncode, after_ready=cur.reached_ready,
            launching=self.phase == Phase.LAUNCHING)
        for f in dropped:
            acts.append(Log("engine.failure_line_uncorroborated", "warning", {
                "profile": self.profile, "failure_class": f.failure.value, "line": f.line_no,
                "returncode": inp.returncode, "after_ready": cur.reached_ready,
                "hint": "the engine did not fail the way this line says; not acted on"}))
        verdict = STOP_VERDICTS.get(reason) if reason is not None else None
        failure = classify_failure(inp.returncode, failures, verdict, after_ready=cur.reached_ready)
        witness = next((f for f in failures if f.failure is failure), failures[0] if failures else None)
        refused = (P.refused_flag(witness.message)
                   if witness is not None and failure is FailureClass.FLAG_REFUSED else None)
        if witness is not None:
            message = witness.message
        elif reason is None:
            message = f"engine exited with returncode {inp.returncode}"
        else:
            message = f"stopped by the supervisor: {reason.value}"
        return acts + self._fail_over(failure, message, now, after_ready=cur.reached_ready,
                                      refused_flag=refused,
                                      reported_by=reported_only(failure, witness, failures))

    def _fail_over(self, failure: FailureClass, message: str, now: float,
                   after_ready: bool, refused_flag: str | None = None, *,
                   reported_by: int | None = None) -> list[Action]:
        """The current attempt is over because of `failure`: failover.decide_next_profile says
        what next (retry, fall back, wait, exit); this carries it out."""
        profile = self.profile or ""
        self._close_attempt(now, Outcome.CRASHED if after_ready else Outcome.FAILED, failure)
        acts: list[Action] = [self._failed_log(failure, message, now, after_ready, refused_flag)]
        if not after_ready and self._rollback is None:  # a failed reload rolls back, never derives
            derived = self._derive(failure, profile, message, refused_flag, acts, now=now,
                                   reported_by=reported_by)
            if derived is not None:
                return derived
        crashes = self._crashes.get(profile, 0)
        # A derived profile fails over as its written rung would: to the rung after its base.
        parent = self._derived.get(profile)
        rung = parent.base if parent is not None else profile
        decision = decide_next_profile(failure, rung, after_ready=after_ready, crashes=crashes,
                                       ladder=self._ladder(), refused_flag=refused_flag)
        if self._rollback is not None and not isinstance(decision, RetrySame | WaitThenSame):
            # The reloaded command failed before READY (refused, capture, hang, never ready):
            # not the ladder's business but the change's. The command that served comes back.
            return acts + self._roll_back(failure, message, now)
        if after_ready and not isinstance(decision, ExitConfig | WaitThenSame):
            self._crashes[profile] = crashes + 1
        match decision:
            case ExitConfig():
                fix = (f"; fix: {P.environment_fix(message)}" if failure is FailureClass.ENVIRONMENT
                       else "")
                return acts + self._exit(ExitCode.CONFIG, f"{failure.value}: {message}{fix}", now)
            case WaitThenSame():
                return acts + self._wait_temporary(failure, message, now, profile, engine_said=True)
            case RetrySame(retry=retry, of=of):
                acts.append(Log("profile.retry_same", "warning", {
                    "profile": profile, "failure_class": failure.value, "retry": retry, "of": of}))
                acts += self._set_phase(Phase.RESTARTING, now)
                return acts + self._launch(profile, f"retry after {failure.value}", now,
                                           self.settings.backoff_s, failure.value)
            case GiveUp(why=why):
                self._gave_up_on(profile, failure, acts, reported_by)
                return acts + self._exit(
                    ExitCode.ALL_PROFILES_FAILED,
                    f"no profile left to try after {profile} failed with {failure.value} ({why})",
                    now)
            case FallBack(target=target, why=why):
                self._gave_up_on(profile, failure, acts, reported_by)
                acts.append(Log("profile.fallback", "warning", {
                    "from_profile": profile, "to_profile": target, "failure_class": failure.value,
                    "rule": why}))
                acts += self._set_phase(Phase.RESTARTING, now)
                return acts + self._launch(target, f"fallback after {failure.value}", now,
                                           self.settings.backoff_s, failure.value)
            case _:
                assert_never(decision)

    def _failed_log(self, failure: FailureClass, message: str, now: float, after_ready: bool,
                    refused_flag: str | None) -> Log:
        profile = self.profile or ""
        fields: dict[str, object] = {
            "profile": profile, "attempt": self.attempt, "failure_class": failure.value,
            "message": message, "after_ready": after_ready, "seconds": self._seconds(now) or 0.0,
        }
        if refused_flag is not None:
            fields["refused_flag"] = refused_flag
            fields["hint"] = (f"SGLang refuses {refused_flag} on this machine: remove it from "
                              f"profile {profile}")
        return Log("engine.failed", "error", fields)

    def _ladder(self) -> Ladder:
        return Ladder(order=self._order, remediation=self.settings.remediation,
                      failed=frozenset(self._failed), skipped=frozenset(self._skipped),
                      last_good=self.settings.last_good, probation=self._probation,
                      same_profile_retries=self.settings.same_profile_retries,
                      flags=self.settings.profile_flags)

    # -- timers, signals, reloads ---------------------------------------------------------

    def _on_timer(self, inp: TimerFired, now: float) -> list[Action]:
        if inp.name == TEMPORARY_TIMER:
            return self._on_temporary_timer(now)
        if not self.cur.engine_alive or self.cur.stopping:
            return []
        verdict = timer_verdict(inp.name, self.phase)
        if verdict in (StopReason.HANG, StopReason.START_TIMEOUT) and self.cur.log_on_stdout:
            # Not a hang: SGLang started on stdout, where its lines are never read. Another
            # profile would go the same way, so no profile is blamed and the ladder stays.
            return [Log("engine.log_on_stdout", "error", {
                "profile": self.profile, "phase": self.phase.value,
                "problem": "SGLang writes its log to stdout (a logging config of its own, e.g. "
                           "SGLANG_LOGGING_CONFIG_PATH); the supervisor reads SGLang's log from "
                           "stderr only, so it cannot see the start complete",
                "fix": "send SGLang's log handlers to ext://sys.stderr, or remove "
                       "SGLANG_LOGGING_CONFIG_PATH from the profile's env"}),
                    *self._stop(StopReason.LOG_ON_STDOUT)]
        match verdict:
            case StopReason.HANG:
                return [Log("engine.hang", "error", {"profile": self.profile, "phase": self.phase.value,
                                                     "stall_s": self.settings.stall_s}),
                        *self._stop(StopReason.HANG)]
            case StopReason.START_TIMEOUT:
                return [Log("engine.start_timeout", "error", {"profile": self.profile,
                                                              "start_s": self.settings.start_s}),
                        *self._stop(StopReason.START_TIMEOUT)]
            case None:
                return []
            case reason:
                return self._stop(reason)

    def _on_stop_requested(self, inp: StopRequested, now: float) -> list[Action]:
        acts: list[Action] = [NotifyStopping(),
                              Log("supervisor.stopping", "info", {"signal": inp.signal,
                                                                  "phase": self.phase.value})]
        acts += self._set_phase(Phase.STOPPING, now)
        if not self.cur.engine_alive:
            return acts + self._exit(ExitCode.OK, f"stopped by {inp.signal}", now)
        # A stop overrides whatever stop was already under way (reload, fallback...).
        self.cur.stop_reason = None
        return acts + self._stop(StopReason.SIGNAL)

    def _on_reload(self, inp: ReloadRequested, now: float) -> list[Action]:
        if self.phase == Phase.STOPPING:
            return []
        acts: list[Action] = []
        if self.ready_sent:
            acts.append(NotifyReloading())
        acts.append(Log("supervisor.reload", "info", {"changed": inp.changed,
                                                      "profile": self.profile}))
        old_settings = self.settings
        if inp.settings is not None:
            self.settings = inp.settings
            self._order = ladder_order(inp.settings)
            self._skipped = skipped_known_bad(inp.settings)
        if not inp.changed:
            if self.ready_sent and self.phase in UP_PHASES:
                acts.append(NotifyReady())
            return acts
        # The command changed: give every profile a fresh chance under the new configuration.
        # A serving engine's profile and settings are what a failing new command gives way to
        # (kept from the first reload while one is still unproven).
        if self._rollback is None and self.cur.reached_ready and self.cur.engine_alive and (
                self.profile is not None):
            self._rollback = (self.profile, old_settings)
        self._failed.clear()
        self._crashes.clear()
        self._canary = inp.canary
        target = self.profile if self.profile in self._order else self._order[0]
        if not self.cur.engine_alive:
            return acts + self._launch(target, StopReason.RELOAD.value, now, 0.0,
                                       RestartCause.RELOAD.value if self.attempt else None)
        self.cur.next_profile = target
        acts += self._stop(StopReason.RELOAD)
        if self.cur.stop_reason is StopReason.RELOAD:
            acts += self._set_phase(Phase.RESTARTING, now)
        return acts
