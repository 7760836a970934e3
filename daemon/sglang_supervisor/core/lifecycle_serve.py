"""The lifecycle while the engine serves: health checks, probes, throughput, regression decisions.

Whether a failed check means busy, degraded or wedged is wedge.judge's decision; which engine runs
after a regression decision is regression_action's. This part keeps their inputs (per attempt)
and turns their verdicts into actions.
"""

from __future__ import annotations

from typing_extensions import assert_never

from sglang_supervisor.core.actions import Action, Log
from sglang_supervisor.core.inputs import ProbeFailed, ProbeOk, RegressionDecision
from sglang_supervisor.core.lifecycle_base import LifecycleBase, _round
from sglang_supervisor.core.phases import UP_PHASES, Phase
from sglang_supervisor.core.reasons import StopReason
from sglang_supervisor.core.regression_action import (
    NoTarget,
    Note,
    Relaunch,
    decide_regression_action,
)
from sglang_supervisor.core.wedge import Check, Verdict, judge


class ServingLifecycle(LifecycleBase):
    def _serving_probe_ok(self, inp: ProbeOk, now: float) -> list[Action]:
        if self.phase not in UP_PHASES:
            return []
        acts: list[Action] = [Log("probe.ok", "info", {"profile": self.profile,
                                                       "tok_s": _round(inp.tok_s, 1),
                                                       "ttft_s": _round(inp.ttft_s, 3)})]
        # A generation that completed proves more than /health: it ends a degraded spell too.
        acts += self._judge(Check.PROBE_OK, "", now)
        return acts + self._throughput(self.tok_s, now, force=True)

    def _serving_probe_failed(self, inp: ProbeFailed, now: float) -> list[Action]:
        if self.phase not in UP_PHASES:
            return []
        # A probe failing while serving counts like a failed health check, and hung probes
        # have their own count that a good /health does not clear (alive but not serving).
        check = Check.PROBE_HUNG if inp.hung else Check.HEALTH_FAILED
        return self._judge(check, f"probe: {inp.reason}", now)

    def _refute_failures(self, now: float) -> list[Action]:
        """The engine answered more than `failure_grace_s` after a failure line: that line did
        not bring it down, so it explains nothing that happens later. Within the grace the
        answer may predate the failure (an engine takes a few seconds to die)."""
        cur = self.cur
        if self.phase not in UP_PHASES or not cur.failures:
            return []
        limit = now - self.settings.failure_grace_s
        timed = list(zip(cur.failures, cur.failure_times, strict=True))
        gone = [f for f, t in timed if t <= limit]
        if not gone:
            return []
        cur.failures = [f for f, t in timed if t > limit]
        cur.failure_times = [t for t in cur.failure_times if t > limit]
        return [Log("engine.failure_line_refuted", "info", {
            "profile": self.profile, "failure_classes": sorted({f.failure.value for f in gone}),
            "lines": [f.line_no for f in gone], "reason": "the engine kept serving"})]

    def _judge(self, check: Check, reason: str, now: float) -> list[Action]:
        """One health or probe result through `wedge.judge`: busy is not wedged, alive is not
        serving."""
        cur = self.cur
        progress, cur.progress = cur.progress, False
        if check in (Check.HEALTH_OK, Check.PROBE_OK):
            refuted = self._refute_failures(now)
            _, cur.wedge = judge(cur.wedge, check, progress=progress,
                                 limit=self.settings.health_failures)
            # Hung probes still counted: the engine answers /health but has not served yet.
            if self.phase == Phase.DEGRADED and not cur.stopping and not cur.wedge.hung_probes:
                return [*refuted, Log("health.recovered", "info", {"profile": self.profile}),
                        *self._set_phase(Phase.SERVING, now)]
            return refuted
        if self.phase not in UP_PHASES or cur.stopping:
            return []
        verdict, cur.wedge = judge(cur.wedge, check, progress=progress,
                                   limit=self.settings.health_failures)
        if verdict is Verdict.BUSY:
            busy: list[Action] = [Log("health.busy", "info", {
                "profile": self.profile, "reason": reason,
                "why": "the engine made decode progress since the last check: busy, not wedged"})]
            # Progress proves it serves: a degraded spell (earlier failures) is over.
            return busy + (self._set_phase(Phase.SERVING, now) if self.phase == Phase.DEGRADED else [])
        acts: list[Action] = [Log("health.failed", "warning", {
            "profile": self.profile, "reason": reason, "misses": cur.wedge.misses,
            "hung_probes": cur.wedge.hung_probes, "limit": self.settings.health_failures})]
        if verdict is Verdict.NOT_SERVING:
            acts.append(Log("engine.wedged", "error", {
                "profile": self.profile, "misses": cur.wedge.misses,
                "hung_probes": cur.wedge.hung_probes,
                "why": "alive but not serving: generations hang with no decode progress"}))
            return acts + self._stop(StopReason.WEDGED)
        if verdict is Verdict.WEDGED:
            acts.append(Log("engine.wedged", "error", {"profile": self.profile,
                                                       "misses": cur.wedge.misses}))
            return acts + self._stop(StopReason.WEDGED)
        return acts + self._set_phase(Phase.DEGRADED, now)

    def _on_regression(self, inp: RegressionDecision, now: float) -> list[Action]:
        fields = {"profile": self.profile, "decision": inp.kind, "reason": inp.reason,
                  "target": inp.profile}
        action = decide_regression_action(
            inp.kind, inp.profile, serving=self.phase in UP_PHASES, stopping=self.cur.stopping,
            profile=self.profile, order=self._order, excluded=self._excluded())
        match action:
            case Note():
                return [Log("regression.decision", "info", fields)]
            case NoTarget():
                return [Log("regression.decision", "warning", fields),
                        Log("regression.no_target", "warning", fields)]
            case Relaunch(target=target):
                self.cur.next_profile = target
                return [Log("regression.decision", "warning", fields),
                        *self._stop(StopReason.REGRESSION), *self._set_phase(Phase.RESTARTING, now)]
            case _:
                assert_never(action)
