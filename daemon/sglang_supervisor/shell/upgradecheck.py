"""`upgrade --check` and the check a canary passes before any GPU time (issue 24): the candidate
release's version asked from its own interpreter, every profile rewritten for it
(`core/upgradeplan.py`) and put to the candidate's real argument parser when it can be asked
(`shell/reloadcheck.py`; the simulator's parser is its catalogue)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import structlog

from sglang_supervisor.core.canary import CanaryPlan
from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem
from sglang_supervisor.core.profiles import REDACTED, render
from sglang_supervisor.core.upgradeplan import UpgradePlan, candidate_config, plan_upgrade
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell import reloadcheck
from sglang_supervisor.shell.engineproc.preflight import Prepared

log = structlog.get_logger("sglang_supervisor")

_KEY_FILE_PATH = "/run/sglang-supervisor/engine-config.yaml"  # displayed only, never written


class CandidateRefused(ConfigError):
    """The candidate cannot run the tuned profile: the reload is refused before anything stops,
    and the loop records the verdict (`Upgrades.refused`; not from the reading thread)."""

    def __init__(self, python: str, version: str, reason: str) -> None:
        super().__init__([ConfigProblem("engine.candidate.python", reason,
                                        "run sglang-supervisor upgrade --check and fix the tuned "
                                        "profile for the candidate")], "upgrade canary")
        self.python, self.version, self.reason = python, version, reason


def check_candidate(config: Config, current: str, python: str,
                    environ: Mapping[str, str] | None = None) -> UpgradePlan:
    """What moving `config` from release `current` to the one installed beside `python` changes.
    Raises ConfigError when the candidate's version cannot be found."""
    cconfig = candidate_config(config, python)
    version = detect_engine_version(cconfig)
    plan = plan_upgrade(config, current, version)
    names = [p.profile for p in plan.profiles if p.expressible]
    renders = {name: render(cconfig, name, version, python=python, secret_config_path=_KEY_FILE_PATH,
                            api_key=REDACTED if cconfig.engine.has_api_key else None)
               for name in names}
    prepared = Prepared(cconfig, version, renders, None)
    problems, why_not = reloadcheck.real_parser_problems(
        prepared, names, os.environ if environ is None else environ)
    if why_not is not None:
        log.info("upgrade.parser_skipped", why=why_not,
                 hint="the candidate's profiles were checked against its flag catalogue only")
    if not problems:
        return plan
    errors: dict[str, list[str]] = {}
    for p in problems:
        errors.setdefault(p.path.removeprefix("profiles."), []).append(p.problem)
    return plan_upgrade(config, current, version, errors)


def candidate_for_reload(config: Config, current: str, python: str,
                         canary: Callable[[str, str], CanaryPlan]) -> tuple[Config, CanaryPlan | None]:
    """The reload's configuration on the candidate release (from release `current`), and the
    canary that judges it (`canary(python, candidate_version)`: `Upgrades.plan`); a candidate that
    cannot express the tuned profile is refused before anything stops."""
    plan = check_candidate(config, current, python)
    if plan.blocked:
        reason = plan.blocked_reason or "the tuned profile cannot run on the candidate"
        log.error("upgrade.refused", candidate=plan.candidate, python=python, reason=reason,
                  hint="nothing was stopped; `sglang-supervisor upgrade --check` shows the fix")
        raise CandidateRefused(python, plan.candidate, reason)
    for p in plan.profiles:
        if not p.unchanged:
            log.info("upgrade.profile_change", profile=p.profile, expressible=p.expressible,
                     renamed=list(p.renamed), dropped=list(p.dropped), refused=list(p.refused),
                     defaults=list(p.defaults))
    return candidate_config(config, python), canary(python, plan.candidate)
