"""Shared pieces of the benchmark suite: distributions, results, the machine description."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sample."""
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class Dist:
    """A sample summarised the same way everywhere in the report."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        if not values:
            raise ValueError("empty sample")
        return cls(tuple(float(v) for v in values))

    @property
    def n(self) -> int:
        return len(self.samples)

    def p(self, q: float) -> float:
        return percentile(self.samples, q)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


@dataclass
class Row:
    """One measured figure: what, its distribution, the target and the verdict."""

    metric: str
    value: str  # rendered measured value (p50/p99/...)
    target: str = ""
    met: bool | None = None  # None: no target
    note: str = ""


@dataclass
class Section:
    key: str
    title: str
    method: str  # how it was measured (what starts, what is timed)
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, object] = field(default_factory=dict)
    error: str | None = None


def fmt_dist(d: Dist, unit: str, scale: float = 1.0, digits: int = 1) -> str:
    f = f"{{:.{digits}f}}"
    return (
        f"p50 {f.format(d.p(50) * scale)} {unit}, p99 {f.format(d.p(99) * scale)} {unit} "
        f"(min {f.format(d.min * scale)}, max {f.format(d.max * scale)}, n={d.n})"
    )


def machine() -> dict[str, str]:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB RAM"
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    try:
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "host": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpu": f"{cpu}, {os.cpu_count()} logical CPUs",
        "memory": mem,
        "python": platform.python_version(),
        "commit": commit,
        "load_at_start": load,
    }


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (clock ticks -> seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
