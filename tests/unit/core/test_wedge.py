"""The wedge verdict (`wedge.judge`): busy is not wedged, alive is not serving."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.wedge import Check, Tally, Verdict, judge

H_OK, H_FAIL, P_OK, P_HUNG = Check.HEALTH_OK, Check.HEALTH_FAILED, Check.PROBE_OK, Check.PROBE_HUNG


@pytest.mark.parametrize(
    ("before", "check", "progress", "verdict", "after"),
    [
        # health failures without progress count up to the limit (3): today's wedge
        (Tally(), H_FAIL, False, Verdict.DEGRADED, Tally(1, 0)),
        (Tally(1, 0), H_FAIL, False, Verdict.DEGRADED, Tally(2, 0)),
        (Tally(2, 0), H_FAIL, False, Verdict.WEDGED, Tally(3, 0)),
        # busy: decode progress since the last check makes a failure not count, and clears both
        (Tally(2, 0), H_FAIL, True, Verdict.BUSY, Tally()),
        (Tally(2, 2), H_FAIL, True, Verdict.BUSY, Tally()),
        (Tally(2, 2), P_HUNG, True, Verdict.BUSY, Tally()),
        # a good /health clears health misses, never hung probes (alive is not serving)
        (Tally(2, 0), H_OK, False, Verdict.HEALTHY, Tally()),
        (Tally(2, 2), H_OK, False, Verdict.HEALTHY, Tally(0, 2)),
        (Tally(0, 2), H_OK, True, Verdict.HEALTHY, Tally(0, 2)),
        # hung probes without progress: counted on both tallies, the third is "not serving"
        (Tally(), P_HUNG, False, Verdict.DEGRADED, Tally(1, 1)),
        (Tally(0, 1), P_HUNG, False, Verdict.DEGRADED, Tally(1, 2)),
        (Tally(0, 2), P_HUNG, False, Verdict.NOT_SERVING, Tally(1, 3)),
        # mixed failures in a row still reach the health limit, as before
        (Tally(1, 1), P_HUNG, False, Verdict.DEGRADED, Tally(2, 2)),
        (Tally(2, 1), P_HUNG, False, Verdict.WEDGED, Tally(3, 2)),
        (Tally(2, 1), H_FAIL, False, Verdict.WEDGED, Tally(3, 1)),
        # a completed generation clears everything
        (Tally(2, 2), P_OK, False, Verdict.HEALTHY, Tally()),
        (Tally(2, 2), P_OK, True, Verdict.HEALTHY, Tally()),
    ],
)
def test_judge_table(before: Tally, check: Check, progress: bool, verdict: Verdict, after: Tally) -> None:
    assert judge(before, check, progress=progress, limit=3) == (verdict, after)


def test_limit_one_and_nonsense_limits() -> None:
    assert judge(Tally(), H_FAIL, progress=False, limit=1) == (Verdict.WEDGED, Tally(1, 0))
    assert judge(Tally(), P_HUNG, progress=False, limit=1) == (Verdict.NOT_SERVING, Tally(1, 1))
    # a limit below one cannot make every check a wedge-free pass: it is taken as one
    assert judge(Tally(), H_FAIL, progress=False, limit=0)[0] is Verdict.WEDGED


def test_a_long_busy_spell_never_wedges() -> None:
    """/health timing out for an hour while decoding continues: never a wedge."""
    tally = Tally()
    for _ in range(1000):
        verdict, tally = judge(tally, H_FAIL, progress=True, limit=3)
        assert verdict is Verdict.BUSY
    assert tally == Tally()


def test_alternating_good_health_and_hung_probes_is_not_serving() -> None:
    """The bug: each good /health reset the count, so hung generations were never a wedge."""
    tally = Tally()
    seen = []
    for check in (H_OK, P_HUNG, H_OK, H_OK, P_HUNG, H_OK, P_HUNG):
        verdict, tally = judge(tally, check, progress=False, limit=3)
        seen.append(verdict)
    assert seen[-1] is Verdict.NOT_SERVING
    assert Verdict.NOT_SERVING not in seen[:-1]
