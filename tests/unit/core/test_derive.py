"""The derivation rules (core/derive.py): one row per rule, and every bound."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.config import PROFILE_NAME
from sglang_supervisor.core.derive import MIN_GRAPH_BS, MIN_PREFILL_TOKENS, Derivation, derive
from sglang_supervisor.core.events import FailureClass

FC = FailureClass
SBO = "--enable-single-batch-overlap"
SBO_LINE = ("ValueError: SBO (single batch overlap) is not supported on SM90 GPUs with latest "
            "sgl-deep-gemm wheel. Please try removing --enable-single-batch-overlap argument.")
TUNED = {"enable-single-batch-overlap": True, "cuda-graph-max-bs": 32, "mem-fraction-static": 0.85,
         "tp-size": 2}

ROWS = [
    # (case, failure, args, refused, resolved_max_bs, expected (name, remove, args) or None)
    ("the refused flag is dropped, nothing else", FC.FLAG_REFUSED, TUNED, SBO, None,
     ("tuned-no-sbo", ("enable-single-batch-overlap",), {})),
    ("a refused flag the profile does not set: nothing to drop", FC.FLAG_REFUSED,
     {"tp-size": 2}, SBO, None, None),
    ("a refused flag set false is not passed", FC.FLAG_REFUSED,
     {"enable-single-batch-overlap": False}, SBO, None, None),
    ("a flag without a short name keeps its own", FC.FLAG_REFUSED,
     {"enable-foo-bar": True}, "--enable-foo-bar", None, ("tuned-no-foo-bar", ("enable-foo-bar",), {})),
    ("flag_refused without the flag's name derives nothing", FC.FLAG_REFUSED, TUNED, None, None, None),
    ("a capture OOM halves the decode graph's max batch size", FC.CAPTURE_OOM, TUNED, None, None,
     ("tuned-graph-bs-16", (), {"cuda-graph-max-bs": 16})),
    ("the per-phase spelling is kept", FC.CAPTURE_OOM, {"cuda-graph-max-bs-decode": "64"}, None, None,
     ("tuned-graph-bs-32", (), {"cuda-graph-max-bs-decode": 32})),
    ("unset: SGLang's resolved value is halved", FC.CAPTURE_OOM, {}, None, 256,
     ("tuned-graph-bs-128", (), {"cuda-graph-max-bs-decode": 128})),
    ("unset and unknown: nothing", FC.CAPTURE_OOM, {}, None, None, None),
    ("not below the floor", FC.CAPTURE_OOM, {"cuda-graph-max-bs": 2 * MIN_GRAPH_BS - 1}, None, None,
     None),
    ("down to the floor", FC.CAPTURE_OOM, {"cuda-graph-max-bs": 2 * MIN_GRAPH_BS}, None, None,
     (f"tuned-graph-bs-{MIN_GRAPH_BS}", (), {"cuda-graph-max-bs": MIN_GRAPH_BS})),
    ("a KV-cache OOM raises the memory fraction a step", FC.KV_CACHE_OOM, TUNED, None, None,
     ("tuned-mem-0.88", (), {"mem-fraction-static": 0.88})),
    ("not above the ceiling", FC.KV_CACHE_OOM, {"mem-fraction-static": 0.95}, None, None, None),
    ("a KV-cache OOM without a set fraction: the ladder decides", FC.KV_CACHE_OOM, {}, None, None,
     None),
    ("a decode list the profile sets derives nothing (SGLang captures the list)", FC.CAPTURE_OOM,
     {"cuda-graph-max-bs": 32, "cuda-graph-bs-decode": [1, 2, 4, 32]}, None, 256, None),
    ("other classes derive nothing", FC.CAPTURE_FAILED, TUNED, None, 256, None),
    ("a hang derives nothing", FC.HANG, TUNED, None, 256, None),
]


@pytest.mark.parametrize(("case", "failure", "args", "refused", "resolved", "expected"), ROWS,
                         ids=[r[0] for r in ROWS])
def test_derive(case: str, failure: FailureClass, args: dict[str, object], refused: str | None,
                resolved: int | None, expected: tuple[str, tuple[str, ...], dict[str, object]] | None
                ) -> None:
    d = derive(failure, "tuned", args, message=SBO_LINE, refused_flag=refused,
               resolved_max_bs=resolved)
    if expected is None:
        assert d is None
        return
    assert d is not None
    assert (d.name, d.remove, dict(d.args)) == expected
    assert d.base == "tuned" and d.steps == 1 and d.change and d.asked_by == SBO_LINE
    assert PROFILE_NAME.match(d.name)


PREFILL_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB."
PREFILL_ROWS = [
    # (case, args, resolved prefill max, oom, expected (name, args) or None)
    ("unset: SGLang's resolved max tokens are halved", {}, 8192, True,
     ("tuned-prefill-tokens-4096", {"cuda-graph-max-bs-prefill": 4096})),
    ("the profile's own max wins over the resolved one", {"cuda-graph-max-bs-prefill": 4096}, 8192, True,
     ("tuned-prefill-tokens-2048", {"cuda-graph-max-bs-prefill": 2048})),
    ("the piecewise spelling (<= 0.5.19) is kept", {"piecewise-cuda-graph-max-tokens": "4096"}, None,
     True, ("tuned-prefill-tokens-2048", {"piecewise-cuda-graph-max-tokens": 2048})),
    ("a prefill graph failure that is no OOM: the ladder decides", {}, 8192, False, None),
    ("unset and unknown: nothing", {}, None, True, None),
    ("not below the floor", {"cuda-graph-max-bs-prefill": 2 * MIN_PREFILL_TOKENS - 1}, None, True, None),
    ("a token list the profile sets derives nothing", {"cuda-graph-bs-prefill": [512, 1024]}, 8192,
     True, None),
]


@pytest.mark.parametrize(("case", "args", "resolved", "oom", "expected"), PREFILL_ROWS,
                         ids=[r[0] for r in PREFILL_ROWS])
def test_a_prefill_graph_oom_trims_the_prefill_graphs_largest_sizes(
        case: str, args: dict[str, object], resolved: int | None, oom: bool,
        expected: tuple[str, dict[str, object]] | None) -> None:
    d = derive(FC.PREFILL_GRAPH_FAILED, "tuned", args, message=PREFILL_OOM,
               resolved_prefill_max=resolved, oom=oom, resolved_max_bs=256)
    if expected is None:
        assert d is None
        return
    assert d is not None and (d.name, dict(d.args)) == expected and d.remove == ()
    assert d.change.startswith("--") and " -> " in d.change


def test_a_derived_profile_derives_again_within_the_bound_and_keeps_earlier_changes() -> None:
    no_sbo = derive(FC.FLAG_REFUSED, "tuned", TUNED, message="l", refused_flag=SBO)
    assert no_sbo is not None
    args = {k: v for k, v in TUNED.items() if k not in no_sbo.remove}
    halved = derive(FC.CAPTURE_OOM, no_sbo.name, args, message="oom", parent=no_sbo, steps=3)
    assert halved == Derivation("tuned-no-sbo-graph-bs-16", "tuned", ("enable-single-batch-overlap",),
                                {"cuda-graph-max-bs": 16}, 2, "--cuda-graph-max-bs 32 -> 16", "oom")
    again = derive(FC.CAPTURE_OOM, halved.name, {**args, **halved.args}, message="oom",
                   parent=halved, steps=3)
    assert again is not None and again.name == "tuned-no-sbo-graph-bs-8" and again.steps == 3
    assert derive(FC.CAPTURE_OOM, again.name, {**args, **again.args}, message="oom", parent=again,
                  steps=3) is None  # the bound


@pytest.mark.parametrize("steps", [0, 1])
def test_the_bound_counts_from_the_written_rung(steps: int) -> None:
    first = derive(FC.CAPTURE_OOM, "tuned", TUNED, message="oom", steps=steps)
    if steps == 0:
        assert first is None  # derivation off
        return
    assert first is not None
    assert derive(FC.CAPTURE_OOM, first.name, {**TUNED, **first.args}, message="oom", parent=first,
                  steps=steps) is None


def test_a_long_name_stays_a_valid_profile_name() -> None:
    base = "a" * 63
    d = derive(FC.FLAG_REFUSED, base, TUNED, message="l", refused_flag=SBO)
    assert d is not None and len(d.name) <= 63 and PROFILE_NAME.match(d.name)
