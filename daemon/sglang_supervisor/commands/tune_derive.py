"""`tune` and derived profiles (issue 25): a written rung that fails with a class `run` answers
with a derived profile (core/derive.py, `restart.derive`, `restart.derived_steps`) is followed,
in tune too, by that derived profile, rendered and started the way `run` would start it, so the
ranking shows what `run` would serve instead of only the failure. Pure decisions here; tune.py
starts the engines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sglang_supervisor.core.config import Config, effective_overlay
from sglang_supervisor.core.derive import Derivation, derive
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.profiles import RenderedCommand, render, with_derived
from sglang_supervisor.engine import patterns as P


@dataclass
class TrialFacts:
    """What one tune start showed that a derivation needs: the graph sizes SGLang resolved (its
    server_args dump, engine/resolved.py) and whether a failure line said out of memory."""

    resolved: dict[str, int] = field(default_factory=dict)
    oom: bool = False


def next_derivation(config: Config, profile: str, failure: str | None, message: str | None, *,
                    facts: TrialFacts, parent: Derivation | None) -> Derivation | None:
    """The derived profile `run` would start after `profile` failed with `failure` (None when
    derivation is off for that class, its bound is reached, no rule applies, or in a group)."""
    if failure is None or failure not in config.restart.derive or config.group is not None:
        return None
    if config.remediation.get(failure) == "stop":
        return None
    try:
        cls = FailureClass(failure)
    except ValueError:
        return None
    base = parent.base if parent is not None else profile
    args: dict[str, object] = dict(effective_overlay(config, base)[0])
    if parent is not None:
        for flag in parent.remove:
            args.pop(flag, None)
        args.update(parent.args)
    text = message or ""
    refused = P.refused_flag(text) if cls is FailureClass.FLAG_REFUSED else None
    return derive(cls, profile, args, message=text, refused_flag=refused,
                  resolved_max_bs=facts.resolved.get("decode"),
                  resolved_prefill_max=facts.resolved.get("prefill"),
                  oom=facts.oom, parent=parent, steps=config.restart.derived_steps)


def render_derived(config: Config, d: Derivation, version: str, template: RenderedCommand, *,
                   python: str, api_key: str | None) -> RenderedCommand:
    """`d` rendered as `run` renders it (its base extended by the change); the secret config
    path of the written rung it came from."""
    path = None
    if template.secret_config is not None and "--config" in template.argv:
        path = template.argv[template.argv.index("--config") + 1]
    return render(with_derived(config, d), d.name, version, python=python, api_key=api_key,
                  secret_config_path=path)


def oom_in(lines: Iterable[str]) -> bool:
    """Whether a failure line said out of memory (a prefill graph failure derives only then)."""
    return any(w in line for line in lines for w in P.OOM_WORDS)
