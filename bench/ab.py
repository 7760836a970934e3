"""bench/ab: the benchmark of two commits, alternated in one sitting, as B/A ratios.

These machines are noisy and differ from each other (docs/PERFORMANCE.md): a figure means little
next to one measured elsewhere or at another time, so a change is judged against its base on the
same host, alternating A and B (A B, then B A, ...: neither side always runs first on a cold
cache), with the same harness on both sides. A is BASE checked out in a worktree of bench/ab's own
(created and removed here; --keep leaves it for the next comparison) with its own venv (its
scripts/bootstrap); B is this checkout. By default A runs this checkout's bench/ (the daemon
differs, the harness does not); --own-harness keeps A's.

    bench/ab BASE [--rounds N] [--own-harness] [--keep] [--workdir DIR] -- BENCH/RUN OPTIONS
    bench/ab main~3 --rounds 2 -- --quick --only ingest,steady --steady-seconds 60

Prints one row per headline figure: A's and B's samples (one per round), B/A of their medians.
`bench/run`'s --out and --json are set here; pass the rest after `--`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from common import ROOT

Figures = dict[str, float]


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _ingest(raw: dict[str, Any]) -> Figures:
    lines = raw["lines"]
    out = {"ingest: reader + file + parser + forwarder, lines/s": lines / _median(r[0] for r in raw["full"]),
           "ingest: reader + file + parser, lines/s": lines / _median(r[0] for r in raw["pump"]),
           "ingest: forwarder alone, lines/s": lines / _median(raw["forwarder_s"])}
    for rate, _base, sup in raw["flood"]:
        out[f"engine writing {rate:,} lines/s: achieved, lines/s"] = sup["rate"]
    return out


def _ready(raw: dict[str, Any]) -> Figures:
    return {"ready line -> READY=1, p50 s": _median(raw["ready_s"]["total"]),
            "stop, idle engine, p50 s": _median(raw["idle_stop_s"]),
            "stop, busy engine, p50 s": _median(raw["busy_stop_s"])}


def _steady(raw: dict[str, Any]) -> Figures:
    return {"CPU, 1000 lines/s + probe, % of a core": raw["busy"]["cpu"],
            "CPU, at rest, % of a core": raw["rest"]["cpu"],
            "RSS max, busy, MiB": max(raw["busy"]["rss"]) / 2**20,
            "RSS max, at rest, MiB": max(raw["rest"]["rss"]) / 2**20}


# What each section's raw samples (bench/run --json) say in one number each; a section missing
# here is run but not compared.
FIGURES: dict[str, Callable[[dict[str, Any]], Figures]] = {
    "ingest": _ingest,
    "ready": _ready,
    "respawn": lambda raw: {"engine exit -> respawn, p50 s": _median(raw["respawn_s"])},
    "hang": lambda raw: {"hang detection / stall timeout, p50": _median(raw["ratio"])},
    "steady": _steady,
    "probe": lambda raw: {"probe error, p50": _median(raw["errors"])},
}


def figures(report: dict[str, Any]) -> Figures:
    """Every headline figure of one `bench/run --json` report (sections that errored: none)."""
    out: Figures = {}
    for sec in report["sections"]:
        pick = FIGURES.get(sec["key"])
        if pick is not None and not sec.get("error") and sec.get("raw"):
            out.update(pick(sec["raw"]))
    return out


def errors(report: dict[str, Any]) -> list[str]:
    """`key: last line of its error` for each section of a report that did not measure."""
    return [f"{sec['key']}: {sec['error'].strip().splitlines()[-1]}" for sec in report["sections"]
            if sec.get("error") and sec["error"].strip()]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def table(a: list[Figures], b: list[Figures]) -> str:
    """Markdown: each figure both sides measured, samples per side, B/A of the medians."""
    keys = [k for k in (a[0] if a else {}) if all(k in f for f in a + b)]
    rows = ["| Figure | A | B | B / A |", "|---|---|---|---|"]
    for k in keys:
        sa, sb = [f[k] for f in a], [f[k] for f in b]
        ma, mb = _median(sa), _median(sb)
        ratio = f"{mb / ma:.2f}" if ma else "n/a"
        rows.append(f"| {k} | {', '.join(map(_fmt, sa))} | {', '.join(map(_fmt, sb))} | {ratio} |")
    return "\n".join(rows)


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


OWNED = ".bench-ab"  # in a worktree bench/ab made: the only kind it reuses, changes or removes
READY = ".bench-ab-venv"  # the worktree's venv was bootstrapped to the end


def prepare_base(base: str, workdir: Path, own_harness: bool) -> None:
    """A's worktree at `base`: made here, or one bench/ab made before (--keep) at that commit."""
    sha = _git("rev-parse", "--verify", f"{base}^{{commit}}")
    if workdir.resolve() == ROOT or ROOT in workdir.resolve().parents:
        sys.exit(f"bench/ab: {workdir} is this checkout (or inside it); pass another --workdir")
    if not workdir.exists():
        _git("worktree", "add", "--detach", str(workdir), sha)
        (workdir / OWNED).write_text(f"made by bench/ab for {base} ({sha})\n")
    elif not (workdir / OWNED).exists():
        sys.exit(f"bench/ab: {workdir} exists and bench/ab did not make it; pass another --workdir")
    elif _git("rev-parse", "HEAD", cwd=workdir) != sha:
        sys.exit(f"bench/ab: {workdir} holds another commit than {base}; pass another --workdir")
    if not own_harness:
        shutil.rmtree(workdir / "bench", ignore_errors=True)
        shutil.copytree(ROOT / "bench", workdir / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    if not (workdir / READY).exists():
        subprocess.run([str(workdir / "scripts" / "bootstrap")], cwd=workdir, check=True)
        (workdir / READY).write_text("scripts/bootstrap finished\n")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """bench/ab's own arguments, and bench/run's (everything after the first `--`)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def sides(rounds: int, a: Path, b: Path) -> list[tuple[str, Path]]:
    """A B, B A, A B, ...: a drift of the machine or a cold first run weighs on both sides."""
    order: list[tuple[str, Path]] = []
    for r in range(rounds):
        pair = [("A", a), ("B", b)]
        order += pair if r % 2 == 0 else pair[::-1]
    return order


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/ab", description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the commit to compare this checkout with (A)")
    p.add_argument("--rounds", type=int, default=2, help="A then B, this many times (default 2)")
    p.add_argument("--own-harness", action="store_true", help="A runs its own bench/, not this one's")
    p.add_argument("--workdir", type=Path, default=None, help="A's worktree (default /tmp/bench-ab-SHA)")
    p.add_argument("--keep", action="store_true", help="keep A's worktree for the next comparison")
    p.epilog = "Options for bench/run go after `--`."
    own, passthrough = split_argv(sys.argv[1:])
    args = p.parse_args(own)
    if any(a.split("=")[0] in ("--out", "--json") for a in passthrough):
        p.error("--out and --json are bench/ab's: leave them out")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    sha = _git("rev-parse", "--short", f"{args.base}^{{commit}}")
    workdir = args.workdir or Path(tempfile.gettempdir()) / f"bench-ab-{sha}"
    samples: dict[str, list[Figures]] = {"A": [], "B": []}
    failed: list[str] = []  # sections that did not measure: their figures are missing below
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each side imports its own daemon
    try:
        prepare_base(args.base, workdir, args.own_harness)
        with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
            for i, (side, root) in enumerate(sides(args.rounds, workdir, ROOT)):
                out = Path(tmp) / f"{side}{i}"
                print(f"== run {i + 1}/{2 * args.rounds}: {side} ({root})", file=sys.stderr, flush=True)
                subprocess.run([str(root / "bench" / "run"), *passthrough, "--out", f"{out}.md",
                                "--json", f"{out}.json"], cwd=root, env=env, check=False)
                if Path(f"{out}.json").exists():
                    rep = json.loads(Path(f"{out}.json").read_text())
                    samples[side].append(figures(rep))
                    failed += [f"run {i + 1} ({side}) {e}" for e in errors(rep)]
    finally:
        if not args.keep and (workdir / OWNED).exists():
            done = subprocess.run(["git", "worktree", "remove", "--force", str(workdir)], cwd=ROOT,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"bench/ab: could not remove {workdir}: {done.stderr.strip()}", file=sys.stderr)
    if not samples["A"] or not samples["B"]:
        print("bench/ab: a side produced no report; see its output above", file=sys.stderr)
        return 1
    print(f"A = {sha} ({args.base}), B = {_git('rev-parse', '--short', 'HEAD')} + working tree; "
          f"{args.rounds} round(s), A and B alternating; bench/run {' '.join(passthrough)}\n")
    print(table(samples["A"], samples["B"]))
    if failed:
        # A comparison with a side's section missing is no comparison: say which, and fail
        # (e.g. B's harness importing a module path A does not have: use --own-harness).
        print("bench/ab: sections that did not measure (their rows are left out):\n  "
              + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
