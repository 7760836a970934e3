"""Flag catalogues: the data matches what real SGLang printed, and validation behaves like argparse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_supervisor.engine.sglang import (
    flag_catalog,
    known_versions,
    nearest_known_version,
    parse_version,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200"


def test_known_versions_sorted_and_cover_the_required_releases() -> None:
    versions = known_versions()
    assert list(versions) == sorted(versions, key=parse_version)
    for required in ("0.5.13", "0.5.17", "0.5.23"):
        assert required in versions


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.5.23", (0, 5, 23)), ("0.5.23.post1", (0, 5, 23)), ("v0.5.9", (0, 5, 9)), ("0.5.24rc0", (0, 5, 24)),
     ("0.5.17+cu130", (0, 5, 17))],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert parse_version(text) == expected


def test_parse_version_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a version"):
        parse_version("latest")


def test_nearest_known_version() -> None:
    assert nearest_known_version("0.5.23") == "0.5.23"
    assert nearest_known_version("0.5.18") == "0.5.17"
    assert nearest_known_version("0.6.0") == known_versions()[-1]
    assert nearest_known_version("0.4.0") == known_versions()[0]


def _usage_options(log: str) -> dict[str, str | None]:
    """Options and their metavar/choices from the argparse usage block SGLang 0.5.17 printed."""
    usage = " ".join(log[log.index("usage:") : log.index("sglang serve: error")].split())
    found: dict[str, str | None] = {}
    for m in re.finditer(r"\[(--[\w-]+)(?: (\[?[^\[\]|]*))?", usage):
        found[m.group(1)] = (m.group(2) or "").strip() or None
    found["--model-path"] = "MODEL_PATH"
    return found


def test_catalog_0_5_17_matches_the_real_usage_text() -> None:
    log = (FIXTURES / "failures" / "unknown_flag.log").read_text(encoding="utf-8", errors="replace")
    usage = _usage_options(log)
    cat = flag_catalog("0.5.17")
    assert len(usage) > 400
    missing = sorted(set(usage) - set(cat.options))
    assert missing == []
    for name, metavar in usage.items():
        spec = cat.options[name]
        assert spec.takes_value == (metavar is not None), name
        if metavar and metavar.startswith("{"):
            listed = metavar[1 : metavar.index("}")].split(",")
            if spec.choices is not None:
                assert sorted(spec.choices) == sorted(listed), name


def test_removed_flags_per_version() -> None:
    for flag in ("--enforce-piecewise-cuda-graph", "--mamba-scheduler-strategy", "--cuda-graph-max-bs"):
        assert flag in flag_catalog("0.5.13").options
        assert flag_catalog("0.5.17").options[flag].deprecated
        assert flag not in flag_catalog("0.5.23").options
    assert flag_catalog("0.5.17").options["--cuda-graph-max-bs"].deprecated_to == "--cuda-graph-max-bs-decode"
    assert flag_catalog("0.5.23").options["--cuda-graph-backend-prefill"].choices == (
        "full", "breakable", "disabled")
    assert "tc_piecewise" in (flag_catalog("0.5.20").options["--cuda-graph-backend-prefill"].choices or ())
    assert flag_catalog("0.5.23").options["--disable-cuda-graph"].deprecated
    assert flag_catalog("0.5.23").allow_abbrev


def test_resolve_exact_prefix_and_ambiguous() -> None:
    cat = flag_catalog("0.5.23")
    assert cat.resolve("--tp-size") == "--tp-size"
    assert cat.resolve("--mem-frac") == "--mem-fraction-static"
    assert cat.resolve("--mem-frac=0.8") == "--mem-fraction-static"
    assert cat.resolve("--enable-metric") is None  # ambiguous: several --enable-metrics*
    assert cat.resolve("--no-such-flag") is None


def test_validate_seed_command_on_0_5_23() -> None:
    seed = ["--model-path", "/m", "--tp-size", "2", "--mamba-scheduler-strategy", "extra_buffer",
            "--enforce-piecewise-cuda-graph", "--trust-remote-code"]
    problems = flag_catalog("0.5.23").validate(seed)
    errors = {p.flag for p in problems if p.severity == "error"}
    assert errors == {"--mamba-scheduler-strategy", "--enforce-piecewise-cuda-graph"}


def test_validate_choices_missing_values_abbreviations_and_deprecation() -> None:
    cat = flag_catalog("0.5.23")
    problems = cat.validate(["--mamba-radix-cache-strategy", "bogus", "--mem-frac", "0.8",
                             "--disable-cuda-graph", "--tp-size"])
    by_flag = {(p.flag, p.severity) for p in problems}
    assert ("--mamba-radix-cache-strategy", "error") in by_flag
    assert ("--mem-frac", "warning") in by_flag
    assert ("--disable-cuda-graph", "warning") in by_flag
    assert ("--tp-size", "error") in by_flag
    assert cat.validate(["--cuda-graph-backend-prefill=tc_piecewise"])[0].severity == "error"
    assert cat.validate(["--trust-remote-code=yes"])[0].severity == "error"
    assert cat.validate(["--cuda-graph-bs-decode", "1", "2", "4", "--tp-size", "2"]) == []
    typo = flag_catalog("0.5.17").validate(["--mamba-scheduler-strategyy", "extra_buffer"])
    assert len(typo) == 1
    assert "did you mean" in typo[0].fix


@pytest.mark.parametrize("version", ["0.5.13", "0.5.17", "0.5.23"])
def test_validate_types_like_argparse(version: str) -> None:
    """The recorded int/float converters refuse what SGLang's argparse refuses with rc 2 (issue 28:
    `max-running-requests: banana` passed check and doctor, then took the engine down on reload)."""
    cat = flag_catalog(version)
    assert cat.options["--max-running-requests"].value_type == "int"
    assert cat.options["--mem-fraction-static"].value_type == "float"
    assert cat.options["--model-path"].value_type is None  # str: anything goes
    [bad] = cat.validate(["--max-running-requests", "banana"])
    assert (bad.flag, bad.severity) == ("--max-running-requests", "error")
    assert "invalid int value 'banana'" in bad.message and "integer" in bad.fix
    assert cat.validate(["--mem-fraction-static", "0.8x"])[0].severity == "error"
    assert cat.validate(["--max-running-requests", "64", "--mem-fraction-static=0.85"]) == []


def test_validate_types_of_every_value_and_int_choices() -> None:
    cat = flag_catalog("0.5.23")
    [bad] = cat.validate(["--cuda-graph-bs-decode", "1", "2", "x"])
    assert "'x'" in bad.message
    # an int choice is compared after the conversion, as argparse does
    assert cat.options["--log-requests-level"].value_type == "int"
    assert cat.validate(["--log-requests-level", "03"]) == []
    assert cat.validate(["--log-requests-level", "7"])[0].severity == "error"
