"""Scenarios hand and pipe (issue 8's A/B diagnostics): a hand launch as the machine's first engine
(s2a_hand_first), and main's hand launch again with stdout into a pipe (s2b_pipe_diagnostic)."""

from __future__ import annotations

from .common import check
from .context import Context


def s2a_hand_first(ctx: Context) -> None:
    """A/B diagnostic: a hand launch as the FIRST engine on the machine (stdout to a file)."""
    cfg = ctx.config("handfirst")
    res = ctx.hand_launch(cfg)
    med = (res.get("probe_series") or {}).get("median_tok_s")
    ctx.record("s2a_hand_first", [check("hand launch measured", bool(med), med)], {"hand_first": res})


def s2b_pipe(ctx: Context) -> None:
    """Diagnostic: the same hand launch with stdout into a pipe that a thread drains."""
    cfg = ctx.hand_cfg
    need = 100 if ctx.real else 10
    if cfg is None or ctx.left() < need:
        ctx.skip("s2b_pipe_diagnostic", f"not run ({ctx.left():.0f} s left, or no hand run)")
        return
    res = ctx.hand_launch(cfg, pipe=True)
    med = (res.get("probe_series") or {}).get("median_tok_s")
    nums = {**ctx.report["scenarios"].get("s2a_hand_first", {}).get("numbers", {}),
            **ctx.report["scenarios"]["s2_throughput"]["numbers"]}
    file_run = nums.get("hand") if isinstance(nums.get("hand"), dict) else nums.get("hand_first", {})
    file_med = (file_run.get("probe_series") or {}).get("median_tok_s")
    ctx.record("s2b_pipe_diagnostic", [check("pipe launch measured", bool(med), med)],
               {"hand_pipe": res, "pipe_over_file": round(med / file_med, 4) if med and file_med else None})
