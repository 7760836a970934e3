"""The simulator's fault grammar: every named fault parses, bad specs fail with the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_supervisor.simulator.faults import (
    Fault,
    FaultSpecError,
    WhenFlag,
    active,
    degrade_multiplier,
    parse_fault,
    parse_faults,
    split_env,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("capture-fail:prefill", Fault("capture-fail", stage="prefill", mode="oom")),
        ("capture-fail:decode", Fault("capture-fail", stage="decode", mode="oom")),
        ("capture-fail:verify:error", Fault("capture-fail", stage="verify", mode="error")),
        ("capture-fail:draft", Fault("capture-fail", stage="draft", mode="oom")),
        ("capture-fail:decode:oom", Fault("capture-fail", stage="decode", mode="oom")),
        ("capture-fail:draft-extend+rank=1", Fault("capture-fail", stage="draft-extend", mode="oom", rank=1)),
        ("kv-oom", Fault("kv-oom")),
        ("hang:load", Fault("hang", stage="load")),
        ("hang:capture", Fault("hang", stage="capture")),
        ("hang:serving", Fault("hang", stage="serving")),
        ("hang:serving@25", Fault("hang", stage="serving", at_s=25.0)),
        ("crash:load", Fault("crash", stage="load")),
        ("crash:capture", Fault("crash", stage="capture")),
        ("crash", Fault("crash")),
        ("crash@50+rank=1", Fault("crash", at_s=50.0, rank=1)),
        ("watchdog@3", Fault("watchdog", at_s=3.0)),
        ("nccl-timeout", Fault("nccl-timeout")),
        ("degrade:0.5@60", Fault("degrade", factor=0.5, at_s=60.0)),
        ("eager-fallback@2.5", Fault("eager-fallback", at_s=2.5)),
        ("ignore-sigterm", Fault("ignore-sigterm")),
        ("slow-drain:12", Fault("slow-drain", seconds=12.0)),
        ("warmup-fail", Fault("warmup-fail")),
        ("echo-hostile@1", Fault("echo-hostile", at_s=1.0)),
        ("garbage-output", Fault("garbage-output")),
        ("garbage-output:2", Fault("garbage-output", after=2)),
        ("late-divergence", Fault("late-divergence")),
        ("accept-collapse@5", Fault("accept-collapse", at_s=5.0)),
    ],
)
def test_every_named_fault_parses(spec: str, expected: Fault) -> None:
    assert parse_fault(spec) == expected


def test_when_binding_parses_flag_and_value() -> None:
    f = parse_fault("capture-fail:prefill+when=--cuda-graph-backend-prefill=breakable+when=--tp-size")
    assert f.when == (WhenFlag("--cuda-graph-backend-prefill", "breakable"), WhenFlag("--tp-size", None))


@pytest.mark.parametrize(
    ("argv", "applies"),
    [
        (["--model-path", "m", "--enforce-piecewise-cuda-graph"], True),
        (["--model-path", "m"], False),
        (["--enforce-piecewise-cuda-graph=1"], True),
    ],
)
def test_when_flag_selects_the_profile(argv: list[str], applies: bool) -> None:
    f = parse_fault("capture-fail:prefill+when=--enforce-piecewise-cuda-graph")
    assert f.applies_to(argv) is applies
    assert active([f], argv) == ((f,) if applies else ())


def test_env_fault_names_its_mode() -> None:
    assert parse_fault("env:no-cudart+rank=1") == Fault("env", stage="no-cudart", rank=1)


def test_unless_applies_only_without_the_flag() -> None:
    """Issue 25: a derived profile that sets the flag (a smaller graph) must start cleanly."""
    f = parse_fault("capture-fail:prefill:oom+unless=--cuda-graph-max-bs-prefill")
    assert f.when == (WhenFlag("--cuda-graph-max-bs-prefill", None, absent=True),)
    assert f.applies_to(["--model-path", "m"])
    assert not f.applies_to(["--cuda-graph-max-bs-prefill", "4096"])
    g = parse_fault("capture-fail:decode+unless=--cuda-graph-max-bs-decode=128")
    assert g.applies_to(["--cuda-graph-max-bs-decode", "256"])
    assert not g.applies_to(["--cuda-graph-max-bs-decode=128"])


def test_when_value_must_match() -> None:
    f = parse_fault("kv-oom+when=--mem-fraction-static=0.88")
    assert f.applies_to(["--mem-fraction-static", "0.88"])
    assert f.applies_to(["--mem-fraction-static=0.88"])
    assert not f.applies_to(["--mem-fraction-static", "0.80"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty fault spec"),
        ("explode", "unknown fault kind 'explode'"),
        ("capture-fail", "capture-fail:PHASE"),
        ("capture-fail:sideways", "unknown capture phase 'sideways'"),
        ("capture-fail:decode:maybe", "unknown capture failure mode 'maybe'"),
        ("hang:load@3", "only hang:serving takes '@SECONDS'"),
        ("crash:load@3", "use crash@S"),
        ("kv-oom@3", "kv-oom takes no '@SECONDS'"),
        ("degrade:fast", "FACTOR 'fast' is not a number"),
        ("degrade:1", "FACTOR must be > 0 and != 1"),
        ("slow-drain", "slow-drain:SECONDS"),
        ("watchdog@soon", "is not a number of seconds"),
        ("crash+rank=x", "bad qualifier 'rank=x'"),
        ("crash+when=tp", "use +rank=N, +when=--flag"),
        ("crash+unless=tp", "+unless=--flag[=value]"),
        ("env", "env:cache-perm|"),
        ("env:disk-full", "unknown environment failure 'disk-full'"),
        ("garbage-output:many", "N 'many' is not a count"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError) as err:
        parse_fault(spec)
    assert message in str(err.value)


def test_env_list_splits_on_commas_and_semicolons() -> None:
    assert split_env(" kv-oom, hang:load;;warmup-fail ") == ["kv-oom", "hang:load", "warmup-fail"]
    assert [f.kind for f in parse_faults(split_env("kv-oom;crash@3"))] == ["kv-oom", "crash"]


def test_degrade_factor_below_and_above_one_both_slow_down() -> None:
    assert degrade_multiplier(0.5) == 0.5
    assert degrade_multiplier(4) == 0.25


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False).map(lambda x: round(x, 3)))
def test_any_time_offset_round_trips(seconds: float) -> None:
    assert parse_fault(f"crash@{seconds}").at_s == pytest.approx(seconds)
