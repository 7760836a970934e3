"""Which profile next: the failure that ended an attempt decides retry, fall back, wait or exit.

One owner for "what now after a failure": `decide_next_profile` answers for every failure class
(tests/unit/core/test_decide_next_profile.py holds one row per class), from the failure itself
(`core/failures.classify_failure`, the ranker logscan uses too; `corroborated`), the ladder
(`ladder_order`, `skipped_known_bad`) and the operator's remediation rules (`choose_next`). The
lifecycle carries the answer out.

When SGLang refuses a flag on this machine and names it (`flag_refused`), the profiles that pass
the same flag are not tried after it in this run: they would fail the same way, each after a start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.core.failures import ARGPARSE_EXIT
from sglang_supervisor.core.inputs import Settings
from sglang_supervisor.core.reasons import StopReason, TextEnum


class RemediationAction(TextEnum):
    """The words a remediation rule may name instead of a profile (so no profile may be named
    like one: core/config.py refuses it)."""

    NEXT = "next"  # the next untried profile of the ladder
    STOP = "stop"  # no further profile: exit 69


REMEDIATION_ACTIONS: tuple[str, ...] = tuple(a.value for a in RemediationAction)

# Exit codes that never go down the ladder: another profile cannot fix them.
CONFIG_FAILURES = frozenset({FailureClass.UNKNOWN_FLAG})
# The host, not the profile: exit 78 with the fix, nothing marked bad (no profile can fix it).
ENVIRONMENT_FAILURES = frozenset({FailureClass.ENVIRONMENT})
TEMPORARY_FAILURES = frozenset({FailureClass.GPU_BUSY, FailureClass.PORT_IN_USE})

# What the supervisor's own stop says about the engine when it exits without a better witness.
STOP_VERDICTS: Mapping[StopReason, FailureClass] = {
    StopReason.HANG: FailureClass.HANG,
    StopReason.START_TIMEOUT: FailureClass.HANG,
    StopReason.WEDGED: FailureClass.WEDGED,
    StopReason.PROBE_HUNG: FailureClass.WEDGED,
    StopReason.PROBE_FAILED: FailureClass.WARMUP_FAILED,
    StopReason.CAPTURE_MISSING: FailureClass.CAPTURE_FAILED,
    StopReason.OUTPUT_MISMATCH: FailureClass.OUTPUT_MISMATCH,
}


def corroborated(
    failures: Iterable[EngineFailed],
    *,
    returncode: int | None,
    after_ready: bool,
    launching: bool,
) -> tuple[list[EngineFailed], list[EngineFailed]]:
    """(failure lines the engine's lifecycle confirms, those it does not).

    A log line can be text a user sent (an echoed prompt the parser did not recognise as one):
    the classes that end the service (exit 78, exit 75) count only when what the engine did fits
    them. A rejected command line ends the engine during start-up, with argparse's exit status 2
    or before any weight was loaded; a port it cannot bind, or a flag it refuses (which also rules
    out other profiles), ends it before READY. After READY none of these can be the cause of
    anything.
    """
    kept: list[EngineFailed] = []
    dropped: list[EngineFailed] = []
    for f in failures:
        if f.failure in CONFIG_FAILURES:
            ok = not after_ready and (returncode == ARGPARSE_EXIT or launching)
        elif f.failure in (FailureClass.PORT_IN_USE, FailureClass.FLAG_REFUSED,
                           *ENVIRONMENT_FAILURES):
            ok = not after_ready
        else:
            ok = True
        (kept if ok else dropped).append(f)
    return kept, dropped


def reported_only(failure: FailureClass, witness: EngineFailed | None,
                  failures: Iterable[EngineFailed]) -> int | None:
    """The worker node whose report alone says `failure`, or None when this host's engine agrees.

    A report on the group link is signed by a holder of the group's secret, not by the engine:
    it may stop the group's start (the leader's ranks cannot finish without the node's), but a
    profile is remembered as bad only when the leader's own engine showed the same class.
    """
    if witness is None or witness.node is None:
        return None
    if any(f.node is None and f.failure is failure for f in failures):
        return None
    return witness.node


def ladder_order(settings: Settings) -> tuple[str, ...]:
    """Configuration order, with the last known good profile first. `--retry-known-bad` means
    "the fault is fixed": the start climbs from the best profile, as on a fresh machine; starting
    the last good fallback first would never reach the better ones it was meant to retry."""
    order = list(settings.profiles)
    if settings.retry_known_bad:
        return tuple(order)
    if settings.last_good in order:
        order.remove(settings.last_good)
        order.insert(0, settings.last_good)
        if settings.probation in order and settings.probation != settings.last_good:
            order.remove(settings.probation)
            order.insert(0, settings.probation)
    return tuple(order)


def skipped_known_bad(settings: Settings) -> dict[str, str]:
    """Known-bad profiles this run skips. If every profile is known bad, none is skipped:
    refusing to start at all would pin the service down until the entries expire."""
    if settings.retry_known_bad:
        return {}
    bad = {p: c for p, c in settings.known_bad.items() if p in settings.profiles}
    if len(bad) >= len(settings.profiles):
        return {}
    return bad


def choose_next(
    failure: FailureClass,
    current: str | None,
    order: tuple[str, ...],
    remediation: Mapping[str, str],
    excluded: Iterable[str],
) -> tuple[str | None, str]:
    """The profile to try after `failure`, and why (a rule name for the log).

    A remediation rule maps a failure class (or "default") to a profile name, "next" or "stop".
    A named profile that was already tried or is known bad falls through to "next".
    Returns (None, why) when the ladder is exhausted or the rule says stop.
    """
    out = set(excluded)
    rule = remediation.get(failure.value, remediation.get("default", RemediationAction.NEXT))
    if rule == RemediationAction.STOP:
        return None, f"remediation[{failure.value}]=stop"
    if rule != RemediationAction.NEXT:
        if rule in order and rule not in out and rule != current:
            return rule, f"remediation[{failure.value}]={rule}"
        why = f"remediation[{failure.value}]={rule} already tried or unknown; next"
    else:
        why = "next"
    start = order.index(current) + 1 if current in order else 0
    for name in order[start:] + order[:start]:
        if name not in out and name != current:
            return name, why
    return None, "every profile tried"


# ----------------------------------------------------------------------------- the decision

@dataclass(frozen=True)
class ExitConfig:
    """Exit 78: the command line is wrong, another profile cannot fix it."""


@dataclass(frozen=True)
class WaitThenSame:
    """Not the profile's fault (port busy, GPU held): the same profile once it clears, exit 75
    when it does not within restart.temporary_wait_s."""


@dataclass(frozen=True)
class RetrySame:
    """A crash after READY, within restart.same_profile_retries: the same profile again."""

    retry: int  # this is the retry-th crash of the profile in this run
    of: int


@dataclass(frozen=True)
class FallBack:
    target: str
    why: str  # the rule that chose it, for the log


@dataclass(frozen=True)
class GiveUp:
    """Exit 69: no profile left (or the remediation rule says stop)."""

    why: str


NextProfile = ExitConfig | WaitThenSame | RetrySame | FallBack | GiveUp


@dataclass(frozen=True)
class Ladder:
    """Where the run stands on the ladder when an attempt fails."""

    order: tuple[str, ...]
    remediation: Mapping[str, str]
    failed: Set[str] = frozenset()  # profiles that failed earlier in this run
    skipped: Set[str] = frozenset()  # known bad, skipped this run
    last_good: str | None = None
    probation: str | None = None  # the profile on probation, until READY or failure
    same_profile_retries: int = 1
    flags: Mapping[str, Set[str]] = field(default_factory=dict)  # profile -> options it sets


def decide_next_profile(failure: FailureClass, profile: str, *, after_ready: bool,
                        crashes: int, ladder: Ladder, refused_flag: str | None = None) -> NextProfile:
    """What follows `profile` failing with `failure`. `crashes`: how often `profile` crashed
    after READY in this run before this failure. `refused_flag`: the flag SGLang named in a
    `flag_refused` failure."""
    if failure in CONFIG_FAILURES or (failure in ENVIRONMENT_FAILURES and not after_ready):
        return ExitConfig()
    if failure in TEMPORARY_FAILURES:
        return WaitThenSame()
    # Outputs that disagree with the reference are the command's, whenever they are seen: the
    # same command again would write the same; the ladder moves on.
    if after_ready and failure is not FailureClass.OUTPUT_MISMATCH \
            and crashes + 1 <= ladder.same_profile_retries:
        return RetrySame(crashes + 1, ladder.same_profile_retries)
    failed = {*ladder.failed, profile}
    excluded = failed | set(ladder.skipped)
    # Untried rungs that pass the flag SGLang refused would fail the same way.
    same_flag = tuple(p for p in ladder.order if p not in excluded
                      and refused_flag in ladder.flags.get(p, ())
                      ) if failure is FailureClass.FLAG_REFUSED and refused_flag else ()
    target, why = choose_next(failure, profile, ladder.order, ladder.remediation,
                              excluded | set(same_flag))
    if same_flag:
        why += f"; not {', '.join(same_flag)}: they pass {refused_flag} too"
    back = ladder.last_good
    if ladder.probation == profile and back is not None and back not in failed \
            and back not in same_flag:
        # Probation failed: straight back to what served last, whatever the rule says.
        target, why = back, "probation failed: back to the last good profile"
    return GiveUp(why) if target is None else FallBack(target, why)
