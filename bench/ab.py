"""bench/ab: the benchmark of two commits, alternated in one sitting, as B/A ratios.

These machines are noisy and differ from each other (docs/PERFORMANCE.md): a figure means little
next to one measured elsewhere or at another time, so a change is judged against its base on the
same host, A then B, several rounds, with the same harness on both sides. A is BASE checked out in
a worktree with its own venv (its scripts/bootstrap); B is this checkout. By default A runs this
checkout's bench/ (the daemon differs, the harness does not); --own-harness keeps A's.

    bench/ab BASE [--rounds N] [--own-harness] [--keep] -- BENCH/RUN OPTIONS
    bench/ab main~3 --rounds 2 -- --quick --only ingest,steady --steady-seconds 60

Prints one row per headline figure: A's and B's samples (one per round), B/A of their medians.
`bench/run`'s --out and --json are set here; pass the rest after `--`.
"""

from __future__ import annotations

import argparse
import json
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


def prepare_base(base: str, workdir: Path, own_harness: bool) -> Path:
    sha = _git("rev-parse", "--verify", f"{base}^{{commit}}")
    if not workdir.exists():
        _git("worktree", "add", "--detach", str(workdir), sha)
    elif _git("rev-parse", "HEAD", cwd=workdir) != sha:
        sys.exit(f"bench/ab: {workdir} holds another commit than {base}; remove it or pass --workdir")
    if not own_harness:
        shutil.rmtree(workdir / "bench", ignore_errors=True)
        shutil.copytree(ROOT / "bench", workdir / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    if not (workdir / ".venv" / "bin" / "python").exists():
        subprocess.run([str(workdir / "scripts" / "bootstrap")], cwd=workdir, check=True)
    return workdir


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/ab", description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the commit to compare this checkout with (A)")
    p.add_argument("--rounds", type=int, default=2, help="A then B, this many times (default 2)")
    p.add_argument("--own-harness", action="store_true", help="A runs its own bench/, not this one's")
    p.add_argument("--workdir", type=Path, default=None, help="A's worktree (default /tmp/bench-ab-SHA)")
    p.add_argument("--keep", action="store_true", help="keep A's worktree for the next comparison")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: options for bench/run")
    args = p.parse_args()
    passthrough = [a for a in args.bench_args if a != "--"]
    if any(a.split("=")[0] in ("--out", "--json") for a in passthrough):
        p.error("--out and --json are bench/ab's: leave them out")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    sha = _git("rev-parse", "--short", f"{args.base}^{{commit}}")
    workdir = args.workdir or Path(tempfile.gettempdir()) / f"bench-ab-{sha}"
    base_root = prepare_base(args.base, workdir, args.own_harness)
    samples: dict[str, list[Figures]] = {"A": [], "B": []}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
            for r in range(args.rounds):
                for side, root in (("A", base_root), ("B", ROOT)):
                    out = Path(tmp) / f"{side}{r}"
                    print(f"== round {r + 1}/{args.rounds}, {side} ({root})", file=sys.stderr, flush=True)
                    subprocess.run([str(root / "bench" / "run"), *passthrough, "--out", f"{out}.md",
                                    "--json", f"{out}.json"], cwd=root, check=False)
                    if Path(f"{out}.json").exists():
                        samples[side].append(figures(json.loads(Path(f"{out}.json").read_text())))
    finally:
        if not args.keep:
            _git("worktree", "remove", "--force", str(workdir))
    if not samples["A"] or not samples["B"]:
        print("bench/ab: a side produced no report; see its output above", file=sys.stderr)
        return 1
    print(f"A = {sha} ({args.base}), B = {_git('rev-parse', '--short', 'HEAD')} + working tree; "
          f"{args.rounds} round(s), A then B; bench/run {' '.join(passthrough)}\n")
    print(table(samples["A"], samples["B"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
