"""scripts/gpu/e2e_scenarios/tune.py's comparison of `tune`'s ranking with a hand-measured order
(issue 16, item 4).

The comparison is what the GPU scenario s6_tune decides pass/fail on, so it is tested here on the
numbers the H200 produced and on the cases that must fail.
"""

from __future__ import annotations

from types import ModuleType

import pytest

import gpu_scripts


@pytest.fixture(scope="module")
def e2e() -> ModuleType:
    return gpu_scripts.load("e2e_scenarios.tune")


def test_same_order_agrees(e2e: ModuleType) -> None:
    hand = {"graphs": 201.2, "no-prefill-graph": 200.9, "eager": 61.0}
    assert e2e.ranking_disagreements(["graphs", "no-prefill-graph", "eager"], hand) == []


def test_a_near_tie_may_come_in_either_order(e2e: ModuleType) -> None:
    # 0.15 % apart by hand: within the resolution of one launch, so tune may order them either way.
    hand = {"graphs": 200.9, "no-prefill-graph": 201.2, "eager": 61.0}
    assert e2e.ranking_disagreements(["graphs", "no-prefill-graph", "eager"], hand) == []


def test_a_clear_inversion_is_named(e2e: ModuleType) -> None:
    hand = {"graphs": 201.2, "no-prefill-graph": 200.9, "eager": 61.0}
    bad = e2e.ranking_disagreements(["eager", "graphs", "no-prefill-graph"], hand)
    assert len(bad) == 2
    assert all(b.startswith("tune ranks eager above") for b in bad)


def test_a_profile_tune_could_not_rank_is_a_disagreement(e2e: ModuleType) -> None:
    hand = {"graphs": 201.2, "eager": 61.0}
    assert e2e.ranking_disagreements(["graphs"], hand) == ["eager: measured by hand, not ranked by tune"]


def test_the_tie_fraction_is_a_parameter(e2e: ModuleType) -> None:
    hand = {"a": 100.0, "b": 103.0}
    assert e2e.ranking_disagreements(["a", "b"], hand) != []  # 3 % > the default 2 %
    assert e2e.ranking_disagreements(["a", "b"], hand, tie=0.05) == []
