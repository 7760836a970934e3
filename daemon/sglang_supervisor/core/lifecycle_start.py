"""The lifecycle while an engine starts: its log events, the ready gate, the first probe.

What counts as ready is decided in readiness.py; this part keeps the facts it needs (per
attempt) and turns its verdicts into actions.
"""

from __future__ import annotations

from sglang_supervisor.core.actions import (
    Action,
    CanaryJudged,
    Log,
    MarkGood,
    NotifyReady,
    NotifyStatus,
    RunReadyProbe,
    SetTimer,
)
from sglang_supervisor.core.canary import FIDELITY_FAIL, judge, mismatch_detail
from sglang_supervisor.core.events import (
    CaptureBegan,
    CaptureEnded,
    CaptureProgress,
    DecodeStats,
    DeprecatedFlag,
    Draining,
    EngineCrashed,
    EngineEvent,
    EngineFailed,
    FailureClass,
    HttpUp,
    KVCacheAllocated,
    LogOnStdout,
    PrefillGraphDisabled,
    PrefillStats,
    SchedulerReady,
    ServerArgsSeen,
    ServerReady,
    TracebackLine,
    WeightsLoadBegan,
    WeightsLoaded,
)
from sglang_supervisor.core.inputs import FAILURE_GRACE_TIMER, FidelityFailed, Launched, ProbeFailed, ProbeOk
from sglang_supervisor.core.lifecycle_base import LifecycleBase, _round
from sglang_supervisor.core.phases import STARTING_PHASES, UP_PHASES, Phase
from sglang_supervisor.core.readiness import FirstProbe, Gate, first_probe, ready_gate, without_prefill
from sglang_supervisor.core.reasons import Outcome, StopReason
from sglang_supervisor.engine.resolved import resolved_graph_max

# Engine events the lifecycle has no use for (logscan, the shell's metrics or the parser itself
# use them). tests/unit/core/test_lifecycle_dispatch.py checks that every EngineEvent is either handled
# here or listed: a new event type must be decided on, not silently dropped.
IGNORED_ENGINE_EVENTS: tuple[type[EngineEvent], ...] = (
    DeprecatedFlag, CaptureProgress, SchedulerReady, PrefillStats, Draining, TracebackLine,
)
HANDLED_ENGINE_EVENTS: tuple[type[EngineEvent], ...] = (
    ServerArgsSeen, EngineFailed, EngineCrashed, DecodeStats, WeightsLoadBegan, WeightsLoaded,
    KVCacheAllocated, CaptureBegan, CaptureEnded, PrefillGraphDisabled, HttpUp, ServerReady, LogOnStdout,
)


class StartingLifecycle(LifecycleBase):
    def _on_engine_event(self, ev: EngineEvent, now: float) -> list[Action]:
        if isinstance(ev, EngineFailed | EngineCrashed):
            return self._failure_line(ev, now)
        if isinstance(ev, LogOnStdout):
            self.cur.log_on_stdout = True  # decides what a hang or start timeout means (lifecycle)
            return []
        if isinstance(ev, ServerArgsSeen):
            self.cur.resolved_graphs = resolved_graph_max(ev.args)  # what derive halves if unset
            return []
        acts: list[Action] = []
        if isinstance(ev, DecodeStats):
            self.cur.progress = True  # a `Decode batch` line: decode steps ran since the last one
            if ev.gen_throughput is not None and ev.running_req:
                return self._throughput(ev.gen_throughput, now, force=False)
        if self.phase not in STARTING_PHASES:
            return acts
        if isinstance(ev, WeightsLoadBegan):
            acts += self._set_phase(Phase.LOADING_WEIGHTS, now)
            acts.append(Log("engine.weights_begin", "info", {"profile": self.profile,
                                                              "rank": ev.rank}))
        elif isinstance(ev, WeightsLoaded):
            acts.append(Log("engine.weights_loaded", "info", {
                "profile": self.profile, "rank": ev.rank, "seconds": ev.elapsed_s,
                "mem_usage_gb": ev.mem_usage_gb}))
        elif isinstance(ev, KVCacheAllocated):
            acts.append(Log("engine.kv_cache", "info", {"profile": self.profile, "rank": ev.rank,
                                                         "tokens": ev.tokens}))
        elif isinstance(ev, CaptureBegan | CaptureEnded | PrefillGraphDisabled):
            acts += self._capture_event(ev, now)
        elif isinstance(ev, HttpUp):
            acts += self._set_phase(Phase.WARMING_UP, now)
            acts.append(Log("engine.http_up", "info", {"profile": self.profile, "host": ev.host,
                                                        "port": ev.port}))
        elif isinstance(ev, ServerReady):
            self.cur.ready_line = True
            acts.append(Log("engine.ready", "info", {
                "profile": self.profile, "attempt": self.attempt, "seconds": self._seconds(now)}))
            acts += self._ready_gate(now)
        return acts

    def _failure_line(self, ev: EngineFailed | EngineCrashed, now: float) -> list[Action]:
        cur = self.cur
        if any(f.line_no == ev.line_no and ev.line_no for f in cur.failures):
            # The parser reports a crash line both as EngineCrashed and as its EngineFailed
            # signature: one line, one failure.
            return []
        failed = ev if isinstance(ev, EngineFailed) else EngineFailed(
            ev.line_no, ev.rank, FailureClass.CHILD_CRASHED, ev.message)
        first = not cur.failures
        cur.failures.append(failed)
        cur.failure_times.append(now)
        serving = self.phase in UP_PHASES
        acts: list[Action] = [Log("engine.failure_line", "warning" if serving else "error", {
            "profile": self.profile, "failure_class": failed.failure.value,
            "rank": ev.rank, "line": ev.line_no, "message": failed.message,
            "while_serving": serving})]
        # One line never stops an engine users can reach (HTTP up: warming up or serving): it
        # may be text a user sent (SGLang prints request dict keys unescaped). What the engine
        # does next decides (it exits, or its ready probe, health checks and probes fail).
        reachable = serving or self.phase == Phase.WARMING_UP
        if first and cur.engine_alive and not cur.stopping and not reachable:
            acts.append(SetTimer(FAILURE_GRACE_TIMER, self.settings.failure_grace_s))
        return acts

    def _capture_event(self, ev: CaptureBegan | CaptureEnded | PrefillGraphDisabled,
                       now: float) -> list[Action]:
        cur = self.cur
        if isinstance(ev, CaptureBegan):
            return [*self._set_phase(Phase.CAPTURING_GRAPHS, now),
                    Log("engine.capture_begin", "info", {
                        "profile": self.profile, "owner": ev.owner, "graph": ev.phase,
                        "rank": ev.rank, "backend": ev.backend})]
        if isinstance(ev, CaptureEnded):
            cur.ended.add((ev.owner, ev.phase, ev.rank))
            acts: list[Action] = [Log("engine.capture_end", "info", {
                "profile": self.profile, "owner": ev.owner, "graph": ev.phase, "rank": ev.rank,
                "seconds": ev.elapsed_s, "mem_usage_gb": ev.mem_usage_gb,
                "done": cur.captures_done(), "expected": len(cur.expected)})]
            if self.phase == Phase.CAPTURING_GRAPHS:
                acts.append(NotifyStatus(self.status_text()))
            return acts
        # The engine decided against prefill graphs: do not wait for them.
        cur.expected = without_prefill(cur.expected, ev.rank)
        return [Log("engine.prefill_graph_disabled", "warning",
                    {"profile": self.profile, "reason": ev.reason})]

    def _ready_gate(self, now: float) -> list[Action]:
        """Start the first probe once every capture ended and the ready line was printed."""
        cur = self.cur
        verdict = ready_gate(starting=self.phase in STARTING_PHASES, ready_line=cur.ready_line,
                             probing=cur.probing, expected=cur.expected, ended=cur.ended)
        if verdict.gate is Gate.WAIT:
            return []
        if verdict.gate is Gate.MISSING:
            names = verdict.missing_text()
            cur.failures.append(EngineFailed(
                line_no=0, rank=None, failure=FailureClass.CAPTURE_FAILED,
                message=f"ready line without these CUDA graph captures: {names}"))
            cur.failure_times.append(now)
            return [Log("engine.capture_missing", "error", {"profile": self.profile,
                                                            "missing": names}),
                    *self._stop(StopReason.CAPTURE_MISSING)]
        cur.probing = True
        return [*self._set_phase(Phase.WARMING_UP, now), RunReadyProbe(self.attempt)]

    def _on_launched(self, inp: Launched) -> list[Action]:
        if inp.attempt != self.attempt:
            return []
        self.cur.expected = set(inp.expected)
        return [Log("engine.spawned", "info", {"profile": self.profile, "attempt": inp.attempt,
                                                "pid": inp.pid,
                                                "captures_expected": len(inp.expected)})]

    def _first_probe(self, inp: ProbeOk | ProbeFailed) -> FirstProbe:
        return first_probe(ok=isinstance(inp, ProbeOk), hung=isinstance(inp, ProbeFailed) and inp.hung,
                           probing=self.cur.probing, starting=self.phase in STARTING_PHASES,
                           stopping=self.cur.stopping)

    def _ready(self, inp: ProbeOk, now: float) -> list[Action]:
        """The first probe succeeded: READY."""
        cur = self.cur
        cur.probing = False
        cur.reached_ready = True
        self._temp_deadline, self._temp_failures = None, 0  # a spell of waiting is over
        rec = self._record()
        if rec is not None:
            rec.outcome = Outcome.READY
        acts: list[Action] = [*self._cancel_timers()]
        if self._canary is not None:
            judged, stopped = self._judge_canary(inp.tok_s, inp.ttft_s, inp.fidelity,
                                                 inp.fidelity_detail)
            if stopped:
                return acts + judged  # the candidate stops; the current release comes back
            acts += judged
        # No STATUS= of its own: READY=1 carries the status in the same datagram, so systemd
        # never shows "ready" while the unit is still activating.
        acts += [a for a in self._set_phase(Phase.READY, now) if not isinstance(a, NotifyStatus)]
        acts.append(MarkGood(self.profile or "", self._seconds(now)))
        if self._probation == self.profile:
            acts.append(Log("profile.probation_passed", "info", {"profile": self.profile}))
        self._probation = None
        if self._rollback is not None:
            acts.append(Log("supervisor.reload_proven", "info", {
                "profile": self.profile, "instead_of": self._rollback[0]}))
            self._rollback = None  # the reloaded command proved itself: nothing to go back to
        acts.append(Log("supervisor.ready", "info", {
            "profile": self.profile, "attempt": self.attempt, "tok_s": _round(inp.tok_s, 1),
            "ttft_s": _round(inp.ttft_s, 3), "seconds": self._seconds(now)}))
        acts.append(NotifyReady())
        self.ready_sent = True
        return acts + self._set_phase(Phase.SERVING, now)

    def _judge_canary(self, tok_s: float | None, ttft_s: float | None, fidelity: str,
                      fidelity_detail: str) -> tuple[list[Action], bool]:
        """The candidate's verdict (core/canary.judge), and whether it was stopped: a rejected
        one is, for the rollback (StopReason.CANARY: nothing is marked bad, no rung is walked)."""
        plan = self._canary
        assert plan is not None
        verdict = judge(plan, tok_s, ttft_s, fidelity, fidelity_detail)
        acts: list[Action] = [
            CanaryJudged(self.profile or "", plan, verdict),
            Log("upgrade.verdict", "info" if verdict.promote else "error", {
                "profile": self.profile, "current": plan.current, "candidate": plan.candidate,
                **verdict.to_json()})]
        if not verdict.promote and self._rollback is not None:
            self._canary_reason = verdict.reason  # _roll_back clears the canary
            return acts + self._stop(StopReason.CANARY), True
        self._canary = None
        return acts, False

    def _on_fidelity_failed(self, inp: FidelityFailed, now: float) -> list[Action]:
        """Outputs that disagree with the reference: the start (or the serving engine) failed
        with `output_mismatch`, deterministic for its command; the ladder moves on. At an
        upgrade canary's ready gate it is the candidate that failed: rejected and rolled back,
        the profile (fine on the current release) is not blamed."""
        cur = self.cur
        gate = cur.probing and self.phase in STARTING_PHASES
        if cur.stopping or not (gate or self.phase in UP_PHASES):
            return []  # a stop is under way and decides, or this attempt is over
        cur.probing = False
        if gate and self._canary is not None and self._rollback is not None:
            return self._judge_canary(None, None, FIDELITY_FAIL, mismatch_detail(
                inp.reason, inp.detail, inp.prompt, inp.expected, inp.received))[0]
        message = f"output mismatch ({inp.reason}): {inp.detail}"
        cur.failures.append(EngineFailed(line_no=0, rank=None, failure=FailureClass.OUTPUT_MISMATCH,
                                         message=message[:500]))
        cur.failure_times.append(now)
        return [Log("fidelity.mismatch", "error", {
                    "profile": self.profile, "reason": inp.reason, "detail": inp.detail,
                    "prompt": inp.prompt, "expected": inp.expected, "received": inp.received,
                    "gate": "ready" if gate else "serving"}),
                *self._stop(StopReason.OUTPUT_MISMATCH)]

    def _ready_probe_failed(self, inp: ProbeFailed, verdict: FirstProbe) -> list[Action]:
        self.cur.probing = False
        reason = StopReason.PROBE_HUNG if verdict is FirstProbe.HUNG else StopReason.PROBE_FAILED
        return [Log("probe.failed", "error", {"profile": self.profile, "reason": inp.reason,
                                              "hung": inp.hung, "gate": "ready"}),
                *self._stop(reason)]
