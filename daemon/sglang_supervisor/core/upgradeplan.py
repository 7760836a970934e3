"""What an SGLang upgrade changes in every profile of the ladder, before any GPU time (issue 24).

Each profile as the current release runs it is rewritten for the candidate release
(`engine/migrate.py`): renamed flags, dropped ones, what the candidate refuses (its catalogue,
and the candidate's own argument parser when the shell could ask it: `parser_errors`), and the
defaults that change what the command does (the CUDA graph phases of `engine/graphs.py`, e.g. a
prefill graph that a release turns on by default). The tuned (first) profile must be expressible
on the candidate, else the upgrade is refused (exit 78) with the fix.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_supervisor.core.config import Config
from sglang_supervisor.core.profiles import PYTHON_PLACEHOLDER, REDACTED, base_command, render
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.graphs import PhaseVerdict, graph_phases
from sglang_supervisor.engine.migrate import migrate_args, migrate_env

_PYTHON = "python"  # placeholder interpreter: only the flags after the base command are compared
_KEY_FILE_PATH = "/run/sglang-supervisor/engine-config.yaml"  # displayed only, never written


def candidate_config(config: Config, python: str) -> Config:
    """`config` with the engine started from the candidate release's venv, profiles untouched:
    command[0] becomes `python` when it is a python (or `{python}`), else the program of the same
    name beside it (`/opt/sglang/bin/sglang serve` -> `/opt/sglang-X/bin/sglang serve`); the
    interpreter asked for the version and the real parser is `python`, the version `auto`."""
    command = list(config.engine.command)
    first = command[0]
    name = posixpath.basename(first)
    if first == PYTHON_PLACEHOLDER or name.startswith("python"):
        command[0] = python
    else:
        command[0] = posixpath.join(posixpath.dirname(python), name)
    # A pinned engine.version names the current release: the candidate's is asked from its venv.
    engine = config.engine.model_copy(update={"command": command, "interpreter": python,
                                              "version": "auto"})
    return config.model_copy(update={"engine": engine})


@dataclass(frozen=True)
class ProfileChange:
    profile: str
    renamed: tuple[str, ...] = ()  # "--old v -> --new v (since 0.5.20: note)"
    dropped: tuple[str, ...] = ()  # flags or environment variables the candidate goes without
    refused: tuple[str, ...] = ()  # what the candidate refuses: the profile cannot start there
    fixes: tuple[str, ...] = ()  # one fix per refusal
    defaults: tuple[str, ...] = ()  # behaviour that changes without a flag changing

    @property
    def expressible(self) -> bool:
        return not self.refused

    @property
    def unchanged(self) -> bool:
        return not (self.renamed or self.dropped or self.refused or self.defaults)

    def to_json(self) -> dict[str, object]:
        return {"profile": self.profile, "expressible": self.expressible,
                "renamed": list(self.renamed), "dropped": list(self.dropped),
                "refused": list(self.refused), "fixes": list(self.fixes),
                "defaults": list(self.defaults)}


@dataclass(frozen=True)
class UpgradePlan:
    current: str
    candidate: str
    profiles: tuple[ProfileChange, ...]

    @property
    def tuned(self) -> ProfileChange:
        return self.profiles[0]

    @property
    def blocked(self) -> bool:
        """The tuned profile cannot be expressed on the candidate: no canary may start."""
        return not self.tuned.expressible

    @property
    def blocked_reason(self) -> str | None:
        if not self.blocked:
            return None
        return (f"profile {self.tuned.profile} cannot run on SGLang {self.candidate}: "
                + "; ".join(self.tuned.refused))[:500]

    def to_json(self) -> dict[str, object]:
        return {"current": self.current, "candidate": self.candidate, "blocked": self.blocked,
                "profiles": [p.to_json() for p in self.profiles]}


def _args(config: Config, profile: str, version: str) -> tuple[list[str], dict[str, str]]:
    rc = render(config, profile, version, python=_PYTHON, secret_config_path=_KEY_FILE_PATH,
                api_key=REDACTED if config.engine.has_api_key else None)
    return rc.argv[len(base_command(config, _PYTHON)):], rc.env


def _phase_text(v: PhaseVerdict) -> str:
    if not v.on:
        return "off"
    return f"on ({v.backend})" if v.backend else "on"


def _graph_changes(old_args: Sequence[str], old: str, new_args: Sequence[str], new: str) -> list[str]:
    out: list[str] = []
    before = graph_phases(parse_flags(old_args), old, None)
    after = graph_phases(parse_flags(new_args), new, None)
    for a, b in zip(before, after, strict=True):
        if (a.on, a.backend) != (b.on, b.backend):
            why = f": {'; '.join(b.reasons)}" if b.reasons else ""
            out.append(f"{a.phase} CUDA graph {_phase_text(a)} on {old} -> {_phase_text(b)} on "
                       f"{new}{why}"[:300])
    return out


def profile_change(config: Config, profile: str, current: str, candidate: str,
                   parser_errors: Sequence[str] = ()) -> ProfileChange:
    """One profile as `current` runs it, rewritten for `candidate`."""
    old_args, old_env = _args(config, profile, current)
    moved = migrate_args(old_args, candidate)
    env = migrate_env(old_env, candidate)
    renamed = [f"{m.old} -> {m.new} (since {m.since}: {m.note})"[:300]
               for m in moved.migrations if m.new]
    dropped = [f"{m.old} (since {m.since}: {m.note})"[:300] for m in moved.migrations if not m.new]
    dropped += [f"env {w.flag}: {w.message}"[:300] for w in env.warnings]
    errors = [p for p in moved.problems if p.severity == "error"]
    refused = [f"{p.flag}: {p.message}"[:300] for p in errors]
    fixes = [p.fix[:300] for p in errors]
    for text in parser_errors:
        refused.append(f"the real sglang {candidate} parser: {text}"[:300])
        fixes.append("fix the flag it names in this profile (or in engine.args)")
    defaults = _graph_changes(old_args, current, moved.args, candidate)
    return ProfileChange(profile, tuple(renamed), tuple(dropped), tuple(refused), tuple(fixes),
                         tuple(defaults))


def plan_upgrade(config: Config, current: str, candidate: str,
                 parser_errors: Mapping[str, Sequence[str]] | None = None) -> UpgradePlan:
    """Every profile of the ladder, tuned first: what moving from `current` to `candidate` does.
    `parser_errors`: per profile, what the candidate's own argument parser refused."""
    errs = parser_errors or {}
    return UpgradePlan(current, candidate, tuple(
        profile_change(config, name, current, candidate, errs.get(name, ()))
        for name in config.profile_names))


def plan_text(plan: UpgradePlan) -> list[str]:
    """What `upgrade --check` prints: per profile what changes, and the verdict."""
    lines = [f"SGLang {plan.current} -> {plan.candidate}"]
    for p in plan.profiles:
        state = "ok" if p.expressible else "REFUSED"
        lines.append(f"  profile {p.profile}: {state}" + (", unchanged" if p.unchanged else ""))
        lines += [f"    renamed: {t}" for t in p.renamed]
        lines += [f"    dropped: {t}" for t in p.dropped]
        lines += [f"    new default: {t}" for t in p.defaults]
        for what, fix in zip(p.refused, p.fixes, strict=True):
            lines += [f"    refused: {what}", f"      fix: {fix}"]
    if plan.blocked:
        lines.append(f"upgrade refused: {plan.blocked_reason}")
        lines.append(f"  fix: change profile {plan.tuned.profile} as shown above, then run "
                     "upgrade --check again")
    else:
        lines.append("the tuned profile can run on the candidate: the canary may start")
    return lines
