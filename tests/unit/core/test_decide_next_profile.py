"""Which profile next: `failover.decide_next_profile`, one row per failure class and per rule.

The ladder and the rules are etc/sglang-supervisor/qwen.yaml's (the shipped example): a profile
that fails before READY is marked bad and the remediation rule (else "next") picks the next one;
a crash after READY retries the same profile `same_profile_retries` times; a rejected command line
exits 78, a temporary condition waits (exit 75 past restart.temporary_wait_s), an empty ladder or
a `stop` rule exits 69.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.core.actions import Exit, Launch, Log, MarkBad
from sglang_supervisor.core.config import parse_config
from sglang_supervisor.core.events import EngineFailed, FailureClass
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.failover import (
    ExitConfig,
    FallBack,
    GiveUp,
    Ladder,
    NextProfile,
    RetrySame,
    WaitThenSame,
    corroborated,
    decide_next_profile,
    ladder_order,
    skipped_known_bad,
)
from sglang_supervisor.core.inputs import EngineExited, Launched, Settings, Start, TimerFired
from sglang_supervisor.core.lifecycle import Lifecycle

FC = FailureClass
QWEN = Path(__file__).resolve().parents[3] / "etc" / "sglang-supervisor" / "qwen.yaml"
ORDER = ("tuned", "no-prefill-graph", "low-mem", "no-spec", "eager")
RULES = {"prefill_graph_failed": "no-prefill-graph", "capture_oom": "low-mem",
         "draft_capture_failed": "no-spec", "unknown_flag": "stop", "hang": "next",
         "default": "next"}
QWEN_LADDER = Ladder(order=ORDER, remediation=RULES)


def test_the_table_uses_the_shipped_example() -> None:
    config = parse_config(QWEN.read_text(), str(QWEN))
    assert tuple(config.profile_names) == ORDER and config.remediation == RULES


# The first profile fails before READY, in a fresh run: one row per failure class.
BEFORE_READY: dict[FailureClass, NextProfile] = {
    FC.UNKNOWN_FLAG: ExitConfig(),  # 78: another profile cannot fix the command line
    FC.FLAG_REFUSED: FallBack("no-prefill-graph", "next"),  # without the flag: see FLAG_ROWS
    FC.CAPTURE_OOM: FallBack("low-mem", "remediation[capture_oom]=low-mem"),
    FC.CAPTURE_FAILED: FallBack("no-prefill-graph", "next"),
    FC.DRAFT_CAPTURE_FAILED: FallBack("no-spec", "remediation[draft_capture_failed]=no-spec"),
    FC.PREFILL_GRAPH_FAILED: FallBack("no-prefill-graph",
                                      "remediation[prefill_graph_failed]=no-prefill-graph"),
    FC.KV_CACHE_OOM: FallBack("no-prefill-graph", "next"),
    FC.SCHEDULER_DIED: FallBack("no-prefill-graph", "next"),
    FC.WARMUP_FAILED: FallBack("no-prefill-graph", "next"),
    FC.WATCHDOG_TIMEOUT: FallBack("no-prefill-graph", "next"),
    FC.NCCL_TIMEOUT: FallBack("no-prefill-graph", "next"),
    FC.SCHEDULER_EXCEPTION: FallBack("no-prefill-graph", "next"),
    FC.CHILD_CRASHED: FallBack("no-prefill-graph", "next"),
    FC.CUDA_ERROR: FallBack("no-prefill-graph", "next"),
    FC.HANG: FallBack("no-prefill-graph", "next"),  # the explicit `hang: next` rule
    FC.WEDGED: FallBack("no-prefill-graph", "next"),
    FC.PORT_IN_USE: WaitThenSame(),  # 75 only when it does not clear in time
    FC.GPU_BUSY: WaitThenSame(),
    FC.ENVIRONMENT: ExitConfig(),  # 78 with the fix: the host lacks a tool, no profile can help
    FC.OTHER: FallBack("no-prefill-graph", "next"),
    FC.OUTPUT_MISMATCH: FallBack("no-prefill-graph", "next"),
}


def test_every_failure_class_has_a_row() -> None:
    assert set(BEFORE_READY) == set(FailureClass)


@pytest.mark.parametrize(("failure", "expected"), BEFORE_READY.items(), ids=str)
def test_first_profile_fails_before_ready(failure: FailureClass, expected: NextProfile) -> None:
    got = decide_next_profile(failure, "tuned", after_ready=False, crashes=0, ladder=QWEN_LADDER)
    assert got == expected


def ladder(**kw: object) -> Ladder:
    return Ladder(**{"order": ORDER, "remediation": RULES, **kw})  # type: ignore[arg-type]


ROWS = [
    ("a crash after READY retries the same profile once",
     FC.CUDA_ERROR, "tuned", True, 0, ladder(), RetrySame(1, 1)),
    ("the second crash after READY falls back",
     FC.CUDA_ERROR, "tuned", True, 1, ladder(), FallBack("no-prefill-graph", "next")),
    ("same_profile_retries: 0 falls back at the first crash",
     FC.NCCL_TIMEOUT, "tuned", True, 0, ladder(same_profile_retries=0),
     FallBack("no-prefill-graph", "next")),
    ("three retries allowed: the third crash still retries",
     FC.WEDGED, "low-mem", True, 2, ladder(same_profile_retries=3), RetrySame(3, 3)),
    ("an output mismatch after READY (a periodic check) never retries the same command",
     FC.OUTPUT_MISMATCH, "tuned", True, 0, ladder(), FallBack("no-prefill-graph", "next")),
    ("a remediation rule can name a conservative profile for output_mismatch",
     FC.OUTPUT_MISMATCH, "tuned", False, 0,
     ladder(remediation={"output_mismatch": "eager", "default": "next"}),
     FallBack("eager", "remediation[output_mismatch]=eager")),
    ("a temporary condition after READY is not a crash: wait",
     FC.GPU_BUSY, "tuned", True, 5, ladder(), WaitThenSame()),
    ("the named target already failed: the next untried profile",
     FC.CAPTURE_OOM, "no-spec", False, 0, ladder(failed={"tuned", "low-mem"}),
     FallBack("eager", "remediation[capture_oom]=low-mem already tried or unknown; next")),
    ("the named target is known bad (skipped this run): next",
     FC.CAPTURE_OOM, "tuned", False, 0, ladder(skipped={"low-mem"}),
     FallBack("no-prefill-graph", "remediation[capture_oom]=low-mem already tried or unknown; next")),
    ("the last profile fails: wrap around to an untried one",
     FC.OTHER, "eager", False, 0, ladder(failed={"no-prefill-graph", "low-mem", "no-spec"}),
     FallBack("tuned", "next")),
    ("every profile failed: exit 69",
     FC.OTHER, "eager", False, 0, ladder(failed={"tuned", "no-prefill-graph", "low-mem", "no-spec"}),
     GiveUp("every profile tried")),
    ("a stop rule: exit 69 with the rule named",
     FC.WATCHDOG_TIMEOUT, "tuned", False, 0,
     ladder(remediation={"watchdog_timeout": "stop", "default": "next"}),
     GiveUp("remediation[watchdog_timeout]=stop")),
    ("probation failed: straight back to the last good profile, whatever the rule",
     FC.CAPTURE_OOM, "tuned", False, 0, ladder(probation="tuned", last_good="no-spec"),
     FallBack("no-spec", "probation failed: back to the last good profile")),
    ("probation failed but the last good one failed too: the rule decides",
     FC.CAPTURE_OOM, "tuned", False, 0,
     ladder(probation="tuned", last_good="no-spec", failed={"no-spec"}),
     FallBack("low-mem", "remediation[capture_oom]=low-mem")),
    ("not on probation: last_good changes nothing",
     FC.HANG, "tuned", False, 0, ladder(last_good="no-spec"), FallBack("no-prefill-graph", "next")),
]


@pytest.mark.parametrize(("case", "failure", "profile", "after_ready", "crashes", "lad", "expected"),
                         ROWS, ids=[r[0] for r in ROWS])
def test_decisions(case: str, failure: FailureClass, profile: str, after_ready: bool, crashes: int,
                   lad: Ladder, expected: NextProfile) -> None:
    got = decide_next_profile(failure, profile, after_ready=after_ready, crashes=crashes, ladder=lad)
    assert got == expected, case


# SGLang refused a flag on this machine and named it: the profiles that pass it too would fail the
# same way, each after a start, so the rest of the run does not try them.
SBO = "--enable-single-batch-overlap"
SBO_FLAGS = {"tuned": frozenset({SBO, "--speculative-algorithm"}),
             "no-prefill-graph": frozenset({SBO}), "low-mem": frozenset({SBO}),
             "no-spec": frozenset(), "eager": frozenset()}
FLAG_ROWS = [
    ("the next rungs that pass the refused flag are not tried",
     FC.FLAG_REFUSED, SBO, "tuned", ladder(flags=SBO_FLAGS),
     FallBack("no-spec", f"next; not no-prefill-graph, low-mem: they pass {SBO} too")),
    ("no rung passes it: the plain next",
     FC.FLAG_REFUSED, "--enable-two-batch-overlap", "tuned", ladder(flags=SBO_FLAGS),
     FallBack("no-prefill-graph", "next")),
    ("SGLang's line named no flag we could read: the plain next",
     FC.FLAG_REFUSED, None, "tuned", ladder(flags=SBO_FLAGS), FallBack("no-prefill-graph", "next")),
    ("profiles that failed already are not named again",
     FC.FLAG_REFUSED, SBO, "low-mem", ladder(flags=SBO_FLAGS, failed={"tuned", "no-prefill-graph"}),
     FallBack("no-spec", "next")),
    ("every untried profile passes it: exit 69, saying why",
     FC.FLAG_REFUSED, SBO, "tuned",
     ladder(flags={**SBO_FLAGS, "no-spec": frozenset({SBO})}, failed={"eager"}),
     GiveUp(f"every profile tried; not no-prefill-graph, low-mem, no-spec: they pass {SBO} too")),
    ("a rule that names a rung passing the flag falls through to the next without it",
     FC.FLAG_REFUSED, SBO, "tuned",
     ladder(flags=SBO_FLAGS, remediation={"flag_refused": "low-mem", "default": "next"}),
     FallBack("no-spec", "remediation[flag_refused]=low-mem already tried or unknown; next; "
                         f"not no-prefill-graph, low-mem: they pass {SBO} too")),
    ("probation failed, but the last good profile passes the refused flag: not back there",
     FC.FLAG_REFUSED, SBO, "tuned", ladder(flags=SBO_FLAGS, probation="tuned", last_good="low-mem"),
     FallBack("no-spec", f"next; not no-prefill-graph, low-mem: they pass {SBO} too")),
    ("another class with a flag at hand: the flag changes nothing",
     FC.CAPTURE_OOM, SBO, "tuned", ladder(flags=SBO_FLAGS),
     FallBack("low-mem", "remediation[capture_oom]=low-mem")),
]


@pytest.mark.parametrize(("case", "failure", "flag", "profile", "lad", "expected"),
                         FLAG_ROWS, ids=[r[0] for r in FLAG_ROWS])
def test_a_refused_flag_rules_out_the_profiles_passing_it(
        case: str, failure: FailureClass, flag: str | None, profile: str, lad: Ladder,
        expected: NextProfile) -> None:
    got = decide_next_profile(failure, profile, after_ready=False, crashes=0, ladder=lad,
                              refused_flag=flag)
    assert got == expected, case


def test_the_lifecycle_reads_the_refused_flag_from_sglangs_line_and_skips_its_rungs() -> None:
    """The real 0.5.17 line (tests/fixtures/sglang-0.5.17-h200-seed), through the lifecycle: the
    flag is read from the witness line, logged with a hint, and rules out the rungs passing it."""
    real = ("ValueError: SBO (single batch overlap) is not supported on SM90 GPUs with latest "
            "sgl-deep-gemm wheel. Please try removing --enable-single-batch-overlap argument.")
    lc = Lifecycle(Settings(profiles=ORDER, remediation=RULES, profile_flags=SBO_FLAGS))
    launch = next(a for a in lc.handle(Start(), 0.0) if isinstance(a, Launch))
    lc.handle(Launched(launch.attempt, 42, frozenset()), 1.0)
    lc.handle(EngineFailed(7, "TP0", FC.FLAG_REFUSED, real), 2.0)
    acts = lc.handle(EngineExited(launch.attempt, -9, False), 3.0)
    [failed] = [a for a in acts if isinstance(a, Log) and a.event == "engine.failed"]
    assert failed.fields["failure_class"] == "flag_refused"
    assert failed.fields["refused_flag"] == SBO
    assert failed.fields["hint"] == f"SGLang refuses {SBO} on this machine: remove it from profile tuned"
    assert [a.profile for a in acts if isinstance(a, Launch)] == ["no-spec"]


# The lifecycle turns each kind of decision into its exit code (or a relaunch).
@pytest.mark.parametrize(
    ("failure", "rules", "code"),
    [
        (FC.UNKNOWN_FLAG, RULES, ExitCode.CONFIG),  # 78
        (FC.WATCHDOG_TIMEOUT, {"default": "stop"}, ExitCode.ALL_PROFILES_FAILED),  # 69
        (FC.PORT_IN_USE, RULES, ExitCode.TEMPORARY),  # 75 (temporary_wait_s 0: at once)
        (FC.CAPTURE_OOM, RULES, None),  # a fallback: no exit
        (FC.ENVIRONMENT, RULES, ExitCode.CONFIG),  # 78: install the tool, nothing else helps
    ],
)
def test_the_lifecycle_exits_as_decided(failure: FailureClass, rules: dict[str, str],
                                        code: ExitCode | None) -> None:
    lc = Lifecycle(Settings(profiles=ORDER, remediation=rules))
    launch = next(a for a in lc.handle(Start(), 0.0) if isinstance(a, Launch))
    lc.handle(Launched(launch.attempt, 42, frozenset()), 1.0)
    lc.handle(EngineFailed(7, None, failure, "boom"), 2.0)
    acts = lc.handle(EngineExited(launch.attempt, 2 if failure is FC.UNKNOWN_FLAG else 1, False), 3.0)
    acts += lc.handle(TimerFired("temporary"), 4.0)
    exits = [a.code for a in acts if isinstance(a, Exit)]
    relaunched = [a.profile for a in acts if isinstance(a, Launch)]
    assert exits == ([] if code is None else [code])
    assert relaunched == ([] if code is not None else ["low-mem"])


# Which failure lines count: a line can be text a user sent, so the classes that end the service
# (78, 75) count only when what the engine did fits them.
CORROBORATION_ROWS = [
    # (case, class, returncode, after_ready, launching, counts)
    ("argparse's exit status 2 confirms an unknown flag", FC.UNKNOWN_FLAG, 2, False, False, True),
    ("an unknown flag before any weight loaded (still launching)", FC.UNKNOWN_FLAG, 1, False, True, True),
    ("an unknown-flag line while loading, exit 1: an echoed prompt, not argparse",
     FC.UNKNOWN_FLAG, 1, False, False, False),
    ("an unknown-flag line after READY explains nothing", FC.UNKNOWN_FLAG, 2, True, False, False),
    ("a port that cannot be bound ends the engine before READY", FC.PORT_IN_USE, 1, False, False, True),
    ("a port-in-use line after READY explains nothing", FC.PORT_IN_USE, -9, True, False, False),
    ("a refused flag before READY counts (SGLang refuses it at start)",
     FC.FLAG_REFUSED, -9, False, False, True),
    ("a refused-flag line after READY explains nothing (it would rule out rungs)",
     FC.FLAG_REFUSED, -9, True, False, False),
    ("a missing build tool before READY counts", FC.ENVIRONMENT, -9, False, False, True),
    ("a missing-build-tool line after READY explains nothing (it would exit 78)",
     FC.ENVIRONMENT, -9, True, False, False),
    ("a capture OOM counts whatever the exit", FC.CAPTURE_OOM, -9, False, False, True),
    ("a CUDA error after READY counts (it is a crash)", FC.CUDA_ERROR, -6, True, False, True),
]


@pytest.mark.parametrize(("case", "failure", "rc", "after_ready", "launching", "counts"),
                         CORROBORATION_ROWS, ids=[r[0] for r in CORROBORATION_ROWS])
def test_corroborated(case: str, failure: FailureClass, rc: int, after_ready: bool, launching: bool,
                      counts: bool) -> None:
    line = EngineFailed(12, "TP0", failure, "the line")
    kept, dropped = corroborated([line], returncode=rc, after_ready=after_ready, launching=launching)
    assert (kept, dropped) == (([line], []) if counts else ([], [line]))


LADDER_ROWS = [
    # (case, last_good, probation, known_bad, retry_known_bad, order, skipped)
    ("a fresh machine: configuration order", None, None, {}, False, ORDER, {}),
    ("the last good profile first", "low-mem", None, {}, False,
     ("low-mem", "tuned", "no-prefill-graph", "no-spec", "eager"), {}),
    ("a profile on probation before the last good one", "low-mem", "tuned", {}, False,
     ("tuned", "low-mem", "no-prefill-graph", "no-spec", "eager"), {}),
    ("a last good profile no longer configured changes nothing", "gone", None, {}, False, ORDER, {}),
    ("known-bad profiles are skipped", None, None, {"tuned": "capture_oom"}, False, ORDER,
     {"tuned": "capture_oom"}),
    ("--retry-known-bad skips none", None, None, {"tuned": "capture_oom"}, True, ORDER, {}),
    ("--retry-known-bad climbs from the best profile, not from the last good fallback",
     "low-mem", None, {"tuned": "capture_oom"}, True, ORDER, {}),
    ("--retry-known-bad: a profile on probation does not come first either", "low-mem", "no-spec",
     {}, True, ORDER, {}),
    ("every profile known bad: none skipped (else the service could never start)", None, None,
     dict.fromkeys(ORDER, "hang"), False, ORDER, {}),
]


@pytest.mark.parametrize(("case", "last_good", "probation", "known_bad", "retry", "order", "skipped"),
                         LADDER_ROWS, ids=[r[0] for r in LADDER_ROWS])
def test_ladder(case: str, last_good: str | None, probation: str | None, known_bad: dict[str, str],
                retry: bool, order: tuple[str, ...], skipped: dict[str, str]) -> None:
    s = Settings(profiles=ORDER, last_good=last_good, probation=probation, known_bad=known_bad,
                 retry_known_bad=retry)
    assert ladder_order(s) == order
    assert skipped_known_bad(s) == skipped


def test_an_environment_failure_exits_78_and_blames_no_profile() -> None:
    """torch's real text when a JIT build finds no ninja: exit 78 with the fix, no profile marked
    bad, no other rung started (every rung would fail the same way)."""
    real = "RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)"
    lc = Lifecycle(Settings(profiles=ORDER, remediation=RULES))
    launch = next(a for a in lc.handle(Start(), 0.0) if isinstance(a, Launch))
    lc.handle(Launched(launch.attempt, 42, frozenset()), 1.0)
    lc.handle(EngineFailed(7, "TP0", FC.ENVIRONMENT, real), 2.0)
    acts = lc.handle(EngineExited(launch.attempt, -9, False), 3.0)
    [exit_] = [a for a in acts if isinstance(a, Exit)]
    assert exit_.code == ExitCode.CONFIG and "pip install ninja" in exit_.reason
    assert [a for a in acts if isinstance(a, MarkBad | Launch)] == []
