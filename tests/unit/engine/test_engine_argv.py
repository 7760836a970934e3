"""engine/argv: the one reader of an SGLang command line (the READY gate, doctor, the supervisor)."""

from __future__ import annotations

import pytest

from sglang_supervisor.engine.argv import (
    ALIASES,
    DEFAULT_DECODE_LOG_INTERVAL,
    TP_FLAGS,
    decode_log_interval,
    parse_flags,
    tp_size,
)
from sglang_supervisor.engine.sglang import flag_catalog


@pytest.mark.parametrize(
    ("argv", "names", "expected"),
    [
        (["--port", "30000"], ("--port",), "30000"),
        (["--port=30000"], ("--port",), "30000"),
        (["--port", "1", "--port", "2"], ("--port",), "2"),  # the last occurrence wins
        (["--tp", "4", "--tp-size", "2"], TP_FLAGS, "2"),  # across the spellings of one option
        (["--tp-size", "2", "--tp", "4"], TP_FLAGS, "4"),
        (["--enable-metrics"], ("--enable-metrics",), None),  # a bare switch has no value
        (["--tp-size", "--port", "1"], TP_FLAGS, None),  # an option is not a value
        (["--max-micro-batch", "-1"], ("--max-micro-batch",), "-1"),  # a negative number is one
        (["--lora-paths", "a", "b"], ("--lora-paths",), "a b"),  # nargs: the values, joined
        (["python", "-m", "sglang.launch_server", "--port", "1"], ("--port",), "1"),
        ([], ("--port",), None),
    ],
)
def test_the_value_of_an_option(argv: list[str], names: tuple[str, ...], expected: str | None) -> None:
    assert parse_flags(argv).last(names) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--tp-size", "2"], 2), (["--tp", "4"], 4), (["--tensor-parallel-size=8"], 8), ([], 1),
     (["--tp-size", "two"], 1), (["--tp-size", "0"], 1), (["--tp-size", "-2"], 1)],
)
def test_tp_size(argv: list[str], expected: int) -> None:
    assert tp_size(argv) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], DEFAULT_DECODE_LOG_INTERVAL), (["--decode-log-interval", "5"], 5),
     (["--decode-log-interval", "x"], DEFAULT_DECODE_LOG_INTERVAL), (["--decode-log-interval", "0"], 1)],
)
def test_decode_log_interval(argv: list[str], expected: int) -> None:
    assert decode_log_interval(argv) == expected


def test_with_a_catalogue_an_abbreviation_is_the_option_argparse_would_pick() -> None:
    catalog = flag_catalog("0.5.23")
    flags = parse_flags(["--enable-kv-cache-shard", "--mem-fraction-stat", "0.8"], catalog)
    assert flags.on("--enable-kv-cache-sharding")
    assert flags.get("--mem-fraction-static") == "0.8"
    assert not parse_flags(["--enable-kv-cache-shard"]).on("--enable-kv-cache-sharding")


@pytest.mark.parametrize(("value", "on"), [(None, True), ("true", True), ("false", False), ("0", False)])
def test_a_switch_may_carry_a_boolean(value: str | None, on: bool) -> None:
    argv = ["--enable-metrics"] + ([value] if value is not None else [])
    assert parse_flags(argv).on("--enable-metrics") is on


@pytest.mark.parametrize(("alias", "option"), sorted(ALIASES.items()))
def test_an_alias_reads_as_its_option(alias: str, option: str) -> None:
    assert parse_flags([alias, "7"]).last((option,)) == "7"
    assert parse_flags([f"{alias}=7"]).get(option) == "7"
    assert parse_flags([option, "1", alias, "2"]).get(option) == "2"  # one option: the last wins
    assert alias not in parse_flags([alias, "7"]).values


def test_an_alias_abbreviated_reads_as_its_option() -> None:
    catalog = flag_catalog("0.5.23")
    assert parse_flags(["--decode-context-parallel", "2"], catalog).get("--dcp-size") == "2"
