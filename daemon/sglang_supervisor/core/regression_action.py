"""What the lifecycle does about a throughput regression decision (core/regression.py decides
whether it is one; this decides which engine runs next).
Table: tests/unit/core/test_decide_regression_action.py.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from typing_extensions import assert_never

from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.failover import RemediationAction, choose_next
from sglang_supervisor.core.inputs import RegressionKind


@dataclass(frozen=True)
class Note:
    """Nothing to do but log it: "keep", or the engine is not serving (starting, stopping)."""


@dataclass(frozen=True)
class NoTarget:
    """The decision names no profile this run can use (every other one failed, or `switch` to a
    profile not in the ladder): keep serving, say so."""


@dataclass(frozen=True)
class Relaunch:
    """Stop the engine (a planned stop: drained) and launch `target` (maybe the same profile)."""

    target: str


RegressionAction = Note | NoTarget | Relaunch


def decide_regression_action(kind: RegressionKind, requested: str | None, *, serving: bool,
                             stopping: bool, profile: str | None, order: tuple[str, ...],
                             excluded: Set[str]) -> RegressionAction:
    """`requested`: the profile a `switch` names. `serving`: the engine is up (READY, serving or
    degraded); `stopping`: a stop of ours is already under way (its reason decides what next)."""
    if not serving or stopping:
        return Note()
    target: str | None
    match kind:
        case "keep":
            return Note()
        case "restart_same":
            target = profile
        case "switch":
            target = requested if requested in order else None
        case "next_profile":  # the next untried profile, whatever the remediation rules say
            target, _ = choose_next(FailureClass.OTHER, profile, order,
                                    {"default": RemediationAction.NEXT}, excluded)
        case _:
            assert_never(kind)
    return NoTarget() if target is None else Relaunch(target)
