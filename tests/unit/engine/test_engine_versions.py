"""Version knowledge: flag migrations both ways, env drift, runtime facts, expected captures."""

from __future__ import annotations

from sglang_supervisor.engine.argv import tp_size
from sglang_supervisor.engine.graphs import ExpectedCapture, expected_captures, settled_by_prefill_off
from sglang_supervisor.engine.sglang import (
    NEWEST_KNOWN_VERSION,
    clean_exit_codes,
    known_versions,
    migrate_args,
    migrate_env,
)

SEED = ["--model-path", "Qwen/Qwen3.6-27B", "--tp-size", "2", "--mamba-scheduler-strategy", "extra_buffer",
        "--enforce-piecewise-cuda-graph", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--trust-remote-code"]


def _errors(m: object) -> list[str]:
    return [p.flag for p in m.problems if p.severity == "error"]  # type: ignore[attr-defined]


def test_seed_on_0_5_23_is_migrated_and_clean() -> None:
    m = migrate_args(SEED, "0.5.23")
    assert "--enforce-piecewise-cuda-graph" not in m.args
    assert "--mamba-scheduler-strategy" not in m.args
    i = m.args.index("--cuda-graph-backend-prefill")
    assert m.args[i + 1] == "breakable"
    j = m.args.index("--mamba-radix-cache-strategy")
    assert m.args[j + 1] == "extra_buffer"
    old = {x.old.split()[0] for x in m.migrations}
    assert old == {"--enforce-piecewise-cuda-graph", "--mamba-scheduler-strategy"}
    assert all(x.since == "0.5.14" for x in m.migrations)
    assert m.problems == []


def test_seed_on_0_5_17_migrates_the_deprecated_aliases_too() -> None:
    m = migrate_args(SEED, "0.5.17")
    assert "--enforce-piecewise-cuda-graph" not in m.args
    assert _errors(m) == []


def test_seed_on_0_5_13_keeps_the_old_flags() -> None:
    m = migrate_args(SEED, "0.5.13")
    assert m.args == SEED
    assert m.migrations == []
    assert _errors(m) == []


def test_reverse_migration_to_0_5_13() -> None:
    m = migrate_args(["--cuda-graph-backend-prefill", "disabled", "--cuda-graph-max-bs-decode", "8",
                      "--cuda-graph-bs-decode", "1", "2", "--mamba-radix-cache-strategy", "no_buffer",
                      "--cuda-graph-backend-decode", "full"], "0.5.13")
    assert m.args == ["--disable-piecewise-cuda-graph", "--cuda-graph-max-bs", "8",
                      "--cuda-graph-bs", "1", "2",
                      "--mamba-scheduler-strategy", "no_buffer"]
    assert [x.new for x in m.migrations][-1] == ""  # full decode backend dropped: it is the default
    assert _errors(m) == []


def test_forward_renames_of_graph_sizes() -> None:
    m = migrate_args(["--cuda-graph-max-bs", "16", "--cuda-graph-bs", "1", "2", "4",
                      "--disable-piecewise-cuda-graph"], "0.5.20")
    assert m.args == ["--cuda-graph-max-bs-decode", "16", "--cuda-graph-bs-decode", "1", "2", "4",
                      "--cuda-graph-backend-prefill", "disabled"]


def test_disable_cuda_graph_stays_with_a_deprecation_warning() -> None:
    m = migrate_args(["--disable-cuda-graph"], "0.5.23")
    assert m.args == ["--disable-cuda-graph"]
    assert [(p.flag, p.severity) for p in m.problems] == [("--disable-cuda-graph", "warning")]


def test_tc_piecewise_is_an_error_from_0_5_22_only() -> None:
    assert _errors(migrate_args(["--cuda-graph-backend-prefill", "tc_piecewise"], "0.5.21")) == []
    m = migrate_args(["--cuda-graph-backend-prefill", "tc_piecewise"], "0.5.22")
    assert _errors(m) == ["--cuda-graph-backend-prefill"]
    assert "breakable" in m.problems[0].fix


def test_mtp_is_refused_with_a_fix() -> None:
    m = migrate_args(["--speculative-algorithm", "MTP"], "0.5.23")
    assert _errors(m) == ["--speculative-algorithm"]
    assert "Unknown speculative algorithm name: MTP" in m.problems[0].message
    assert "NEXTN" in m.problems[0].fix


def test_removed_flag_without_equivalent_says_what_to_do() -> None:
    m = migrate_args(["--collect-tokens-histogram", "--enable-metrics"], "0.5.23")
    [problem] = m.problems
    assert problem.severity == "error"
    assert "removed" in problem.message
    assert "--enable-metrics" in problem.fix


def test_unknown_flag_and_duplicate_after_migration() -> None:
    m = migrate_args(["--enable-custom-all-reduce"], "0.5.23")
    assert _errors(m) == ["--enable-custom-all-reduce"]
    dup = migrate_args(
        ["--enforce-piecewise-cuda-graph", "--cuda-graph-backend-prefill", "disabled"], "0.5.23")
    assert ("--cuda-graph-backend-prefill", "warning") in [(p.flag, p.severity) for p in dup.problems]


def test_generic_alias_from_catalogue() -> None:
    m = migrate_args(["--stream-output"], "0.5.23")
    assert m.args == ["--incremental-streaming-output"]
    assert m.migrations[0].since == "0.5.13"  # already a deprecated alias there


def test_an_abbreviation_is_rendered_in_full_and_still_warned_about() -> None:
    """argparse takes `--decode-context-parallel 2` for `--dcp-size 2`: rendered in full, the READY
    gate and the TP size read what SGLang reads (a prefix read as no option at all expected a
    prefill capture under DCP, and one GPU for `--tensor-parallel 2`)."""
    m = migrate_args(["--decode-context-parallel", "2", "--tensor-parallel=2"], "0.5.23")
    assert m.args == ["--decode-context-parallel-size", "2", "--tensor-parallel-size=2"]  # aliases
    assert [(p.flag, p.severity) for p in m.problems] == [
        ("--decode-context-parallel", "warning"), ("--tensor-parallel", "warning")]
    assert [(c.owner, c.phase) for c in expected_captures(m.args, "0.5.23", 2)] == [("target", "decode")]
    assert tp_size(m.args) == 2
    ambiguous = migrate_args(["--enable-d", "1"], "0.5.23")  # argparse refuses it: left as written
    assert ambiguous.args == ["--enable-d", "1"] and _errors(ambiguous) == ["--enable-d"]


def test_migrate_env_spec_v2() -> None:
    kept = migrate_env({"SGLANG_ENABLE_SPEC_V2": "1", "X": "y"}, "0.5.20")
    assert kept.env == {"SGLANG_ENABLE_SPEC_V2": "1", "X": "y"}
    assert kept.warnings == []
    dropped = migrate_env({"SGLANG_ENABLE_SPEC_V2": "1", "X": "y"}, "0.5.21")
    assert dropped.env == {"X": "y"}
    assert dropped.warnings[0].flag == "SGLANG_ENABLE_SPEC_V2"


def test_runtime_facts() -> None:
    assert clean_exit_codes("0.5.17") == frozenset({0, -9})
    assert clean_exit_codes("0.5.23") == frozenset({0})


def test_expected_captures_plain_tp2() -> None:
    caps = expected_captures(["--tp-size", "2"], "0.5.23", 2)
    assert caps == [ExpectedCapture("target", "prefill", ("TP0", "TP1")),
                    ExpectedCapture("target", "decode", ("TP0", "TP1"))]


def test_expected_captures_seed_nextn_tp2() -> None:
    args = migrate_args(SEED, "0.5.23").args
    caps = expected_captures(args, "0.5.23", 2)
    assert caps == [
        ExpectedCapture("target", "prefill", ("TP0", "TP1")),
        ExpectedCapture("target", "verify", ("TP0", "TP1")),
        ExpectedCapture("draft", "prefill", ("TP0", "TP1")),
        ExpectedCapture("draft", "decode", ("TP0",)),
        ExpectedCapture("draft", "extend", ("TP0",)),
    ]


def test_expected_captures_variants() -> None:
    assert expected_captures(["--disable-cuda-graph"], "0.5.23", 1) == []
    eager = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    assert expected_captures(eager, "0.5.17", 1) == []
    ngram = expected_captures(["--speculative-algorithm", "NGRAM"], "0.5.17", 1)
    assert [(c.owner, c.phase) for c in ngram] == [("target", "prefill"), ("target", "verify")]
    legacy = expected_captures(["--enforce-piecewise-cuda-graph", "--tp-size", "2"], "0.5.13", 2)
    assert [(c.owner, c.phase) for c in legacy] == [("target", "piecewise"), ("target", "legacy")]
    one_step = expected_captures(
        ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1"], "0.5.23", 1)
    assert ("draft", "decode") not in [(c.owner, c.phase) for c in one_step]


def test_a_prefill_disabled_line_settles_the_prefill_graphs_of_its_rank() -> None:
    assert settled_by_prefill_off("prefill", "TP1", "TP1")
    assert settled_by_prefill_off("prefill", "TP1", None)  # the unprefixed main process: every rank
    assert settled_by_prefill_off("piecewise", None, None)
    assert not settled_by_prefill_off("prefill", "TP1", "TP0")
    assert not settled_by_prefill_off("decode", "TP0", "TP0")


def test_the_newest_known_version_is_the_newest_catalogue() -> None:
    assert known_versions()[-1] == NEWEST_KNOWN_VERSION
