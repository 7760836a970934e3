"""Helpers of scenario `warmcache` (scripts/gpu/e2e.py, issue 26): the shipped unit's environment
emulated per start, the engine's start-up phases read from its log, and cache sizes on disk.

The emulation (no systemd here): the unit's CacheDirectory= becomes CACHE_DIRECTORY=<dir>, its
PrivateTmp=yes a fresh TMPDIR per supervisor start, its ProtectHome=yes (no home for User=sglang) a
fresh empty HOME per start; XDG_CACHE_HOME and HF_HOME are the unit's (under the cache directory).
The cache variables scripts/gpu-e2e exports for its other scenarios (TVM_FFI_CACHE_DIR and
TRITON_CACHE_DIR into /tmp/jit) are removed, so the supervisor has to place every one itself.
A library that writes to a hard-coded /tmp (not TMPDIR) is not caught by the emulation."""

from __future__ import annotations

import itertools
import os
import re
import stat
from pathlib import Path
from typing import Any

from sglang_supervisor.core.jitcache import CACHE_VAR_NAMES, CACHE_VARS, ENGINE_CACHE_SUBDIR

# The engine's start-up, in the order SGLang 0.5.17 logs it (engine/patterns.py has the same phrases).
PHASE_MARKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("server_args", re.compile(r"server_args=")),
    # the scheduler process is up (a spawned interpreter: it imports torch and SGLang again)
    ("init_distributed", re.compile(r"Init torch distributed begin")),
    ("weights_begin", re.compile(r"Load weight begin")),
    ("weights_end", re.compile(r"Load weight end")),
    ("kv_allocated", re.compile(r"KV Cache is allocated")),
    ("capture_begin", re.compile(r"Capture (?:(?:target|draft) [\w-]+ CUDA|cuda) graph begin")),
    ("capture_end", re.compile(r"Capture (?:(?:target|draft) [\w-]+ CUDA|cuda) graph end")),
    ("startup_timings", re.compile(r"Engine startup timings")),
    ("uvicorn_running", re.compile(r"Uvicorn running on")),
    ("ready_line", re.compile(r"The server is fired up and ready to roll")),
)
# 0.5.17's own account: `Engine startup timings (s): load_weight=0.18, ..., cuda_graph={prefill=78.90, ...}`
STARTUP_TIMINGS = re.compile(r"Engine startup timings \(s\): (?P<text>.*)$")
__all__ = ["CACHE_VARS", "CACHE_VAR_NAMES", "cache_report", "engine_environ", "newer_files", "phases",
           "unit_environment"]
CAPTURE_NAME = re.compile(r"Capture (?P<owner>target|draft) (?P<graph>[\w-]+) CUDA graph (?P<state>begin|end)")


def unit_environment(base: dict[str, str], cache_dir: Path, scratch: Path) -> dict[str, str]:
    """The environment the shipped unit gives the supervisor, for one start (see the module doc)."""
    tmp, home = scratch / "tmp", scratch / "home"
    tmp.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in base.items() if k not in CACHE_VAR_NAMES}
    env.update(CACHE_DIRECTORY=str(cache_dir), TMPDIR=str(tmp), HOME=str(home),
               XDG_CACHE_HOME=str(cache_dir), HF_HOME=str(cache_dir / "huggingface"))
    return env


def tree_bytes(path: Path) -> int:
    total = 0
    for top, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def sizes(path: Path, depth: int = 1) -> dict[str, int]:
    """Bytes per entry of `path` (and, for depth 2, per entry of each entry), links not followed."""
    out: dict[str, int] = {}
    if not path.is_dir():
        return out
    for entry in sorted(path.iterdir()):
        if entry.is_symlink():
            continue
        if depth > 1 and entry.is_dir():
            for sub in sorted(entry.iterdir()):
                if not sub.is_symlink():
                    out[f"{entry.name}/{sub.name}"] = tree_bytes(sub) if sub.is_dir() else sub.stat().st_size
        else:
            out[entry.name] = tree_bytes(entry) if entry.is_dir() else entry.stat().st_size
    return out


def cache_report(cache_dir: Path) -> dict[str, Any]:
    """Per key directory, bytes per cache; and what lies in the cache directory outside the keys."""
    keys = cache_dir / ENGINE_CACHE_SUBDIR
    per_key = {k.name: sizes(k) for k in sorted(keys.iterdir())} if keys.is_dir() else {}
    outside = {k: v for k, v in sizes(cache_dir).items() if k != ENGINE_CACHE_SUBDIR}
    return {"keys": per_key, "outside_keys": outside}


def phases(lines: list[tuple[float, str]], t0: float) -> dict[str, Any]:
    """Seconds from `t0` to each start-up mark (first occurrence; captures each), and the gaps
    between consecutive marks, largest first: what dominated this start."""
    marks: list[tuple[str, float]] = []
    if lines:
        marks.append(("first_line", lines[0][0] - t0))
    seen: set[str] = set()
    for t, text in lines:
        cap = CAPTURE_NAME.search(text)
        if cap:
            marks.append((f"capture_{cap['owner']}_{cap['graph']}_{cap['state']}", t - t0))
            continue
        for name, pat in PHASE_MARKS:
            if name not in seen and not name.startswith("capture") and pat.search(text):
                seen.add(name)
                marks.append((name, t - t0))
    own = [m["text"][:400] for _, text in lines if (m := STARTUP_TIMINGS.search(text))]
    marks.sort(key=lambda m: m[1])
    gaps = [(f"{a}->{b}", round(tb - ta, 1)) for (a, ta), (b, tb) in itertools.pairwise(marks)]
    if marks:
        gaps.insert(0, (f"launch->{marks[0][0]}", round(marks[0][1], 1)))
    return {"marks": {n: round(t, 1) for n, t in marks}, "sglang_startup_timings": own[:1],
            "largest_gaps": sorted(gaps, key=lambda g: -g[1])[:5]}


def engine_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.decode(errors="replace").partition("=")
        if sep:
            out[k] = v
    return out


def newer_files(root: Path, since: float, limit: int = 20) -> list[str]:
    """Files under `root` modified after `since` (the old /tmp/jit paths must stay untouched)."""
    found: list[str] = []
    if not root.is_dir():
        return found
    for top, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            p = os.path.join(top, name)
            try:
                if os.lstat(p).st_mtime >= since:
                    found.append(p)
            except OSError:
                continue
            if len(found) >= limit:
                return found
    return found
