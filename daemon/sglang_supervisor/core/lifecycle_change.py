"""The lifecycle changing a profile: the smallest change to one that failed (core/derive.py), the
way back to the command that served when a reloaded one fails before READY, and what giving up on
a profile leaves in the state file (a known-bad mark, unless only a peer's report said so).
"""

from __future__ import annotations

from sglang_supervisor.core.actions import Action, Log, MarkBad, RollBack
from sglang_supervisor.core.derive import derive
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.failover import ladder_order, skipped_known_bad
from sglang_supervisor.core.lifecycle_base import LifecycleBase
from sglang_supervisor.core.phases import Phase
from sglang_supervisor.core.reasons import RestartCause
from sglang_supervisor.engine import patterns as P


class ChangingLifecycle(LifecycleBase):
    def _roll_back(self, failure: FailureClass | str, message: str, now: float) -> list[Action]:
        """Back to the profile and settings that served before the reload; the shell puts the
        previous configuration back on `RollBack` (before the `Launch` that follows it). Nothing
        is marked bad: the failed command belongs to a configuration that is gone."""
        assert self._rollback is not None
        profile, settings = self._rollback
        self._rollback = None
        canary, self._canary = self._canary, None
        why = failure.value if isinstance(failure, FailureClass) else failure
        failed = self.profile or ""
        self.settings = settings
        self._order = ladder_order(settings)
        self._skipped = skipped_known_bad(settings)
        self._failed.clear()
        self._crashes.clear()
        self._probation = None
        hint = ("the reloaded configuration failed before READY; the previous one serves "
                "again. Fix the file (sglang-supervisor check / doctor) and reload")
        if canary is not None:
            hint = (f"the upgrade candidate SGLang {canary.candidate} was rolled back; SGLang "
                    f"{canary.current} serves again. It is not tried again until its venv changes "
                    "or `upgrade --retry` asks")
        acts: list[Action] = [
            Log("supervisor.reload_rolled_back", "error", {
                "failed_profile": failed, "failure_class": why, "message": message,
                "profile": profile, "hint": hint}),
            RollBack(profile, why, message),
        ]
        acts += self._set_phase(Phase.RESTARTING, now)
        return acts + self._launch(profile, "rollback after a failed reload", now,
                                   settings.backoff_s, RestartCause.ROLLBACK.value)

    def _derive(self, failure: FailureClass, profile: str, message: str, refused_flag: str | None,
                acts: list[Action], *, now: float,
                reported_by: int | None = None) -> list[Action] | None:
        """The smallest change to `profile` that answers `failure` (core/derive.py), launched
        before the next written rung; None when no rule applies, it is off or its bound is
        reached, or that derived profile already failed in this run."""
        s = self.settings
        # `remediation: {CLASS: stop}` asks for an exit on that class: no derived attempt first.
        if failure.value not in s.derive_on or s.remediation.get(failure.value) == "stop":
            return None
        parent = self._derived.get(profile)
        base = parent.base if parent is not None else profile
        args = dict(s.profile_args.get(base, {}))
        if parent is not None:
            for flag in parent.remove:
                args.pop(flag, None)
            args.update(parent.args)
        resolved = self.cur.resolved_graphs
        d = derive(failure, profile, args, message=message, refused_flag=refused_flag,
                   resolved_max_bs=resolved.get("decode"),
                   resolved_prefill_max=resolved.get("prefill"),
                   oom=any(w in f.message for f in self.cur.failures for w in P.OOM_WORDS),
                   parent=parent, steps=s.derived_steps)
        if d is None or d.name in self._failed or d.name in s.profiles:
            return None
        self._gave_up_on(profile, failure, acts, reported_by)
        self._derived[d.name] = d
        acts.append(Log("profile.derived", "warning", {
            "from_profile": profile, "to_profile": d.name, "base": d.base,
            "failure_class": failure.value, "change": d.change, "asked_by": d.asked_by,
            "step": d.steps, "of": s.derived_steps}))
        acts += self._set_phase(Phase.RESTARTING, now)
        return acts + self._launch(d.name, f"derived after {failure.value}: {d.change}", now,
                                   s.backoff_s, failure.value)

    def _gave_up_on(self, profile: str, failure: FailureClass, acts: list[Action],
                    reported_by: int | None = None) -> None:
        self._failed.add(profile)
        self._probation = None
        if reported_by is None:
            acts.append(MarkBad(profile, failure))
            return
        # Only a peer says so: the group moves on for this run, the state file keeps no blame
        # (the corroboration rule engine text gets: a claim alone never outlives the run).
        acts.append(Log("profile.bad_not_remembered", "warning", {
            "profile": profile, "failure_class": failure.value, "node_rank": reported_by,
            "hint": f"only node {reported_by} reported {failure.value}; this host's engine showed "
                    "no such failure, so the profile is skipped for this run but not marked "
                    "known-bad. Check that node's journal"}))

