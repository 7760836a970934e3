"""The engine's kernel caches on disk (core/jitcache.py decides): the key directory made and
stamped before a launch, the old key directories pruned to `engine.cache_max_gb`, and the
variables that point the engine's libraries there.

Safety: only directories directly under `<root>/engine-cache/` whose names a key could have are
ever deleted; a symlink there is never followed nor removed, sizes are counted without following
links, and a failure here never blocks a launch (the engine then uses its libraries' defaults)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import structlog

from sglang_supervisor.core.jitcache import (
    ENGINE_CACHE_SUBDIR,
    STAMP_NAME,
    KeyDir,
    PrunePlan,
    cache_env,
    cache_key,
    choose_prune,
    is_key_name,
)
from sglang_supervisor.shell.telemetry import gpu

log = structlog.get_logger("sglang_supervisor.cache")

# A size walk stops counting after this many entries (a hostile or runaway tree stays bounded).
MAX_WALK_ENTRIES = 2_000_000
GIB = 1 << 30


def gpu_models(wanted: set[int] | None) -> list[tuple[str, str | None]]:
    """(name, compute capability) of the engine's GPUs (all when `wanted` is None); [] without NVML."""
    return [(g.name, g.compute_capability) for g in gpu.snapshot() or []
            if wanted is None or g.index in wanted]


def cache_root(environ: Mapping[str, str], configured: str | None) -> str | None:
    """`engine.cache_dir`, else the first path of systemd's $CACHE_DIRECTORY (CacheDirectory=),
    plus `engine-cache`; None when neither is there (outside the unit: nothing is moved)."""
    base = configured or (environ.get("CACHE_DIRECTORY") or "").split(":")[0]
    if not base or not os.path.isabs(base):
        return None
    return os.path.join(base, ENGINE_CACHE_SUBDIR)


def torch_version(engine_python: str) -> str | None:
    """torch's version in the engine's venv, from its dist-info folder name (no import): None when
    it is not found there (e.g. torch from PYTHONPATH)."""
    venv = Path(engine_python).parent.parent
    try:
        for info in sorted(venv.glob("lib/python3*/site-packages/torch-*.dist-info")):
            return info.name[len("torch-"):-len(".dist-info")]
    except OSError:
        return None
    return None


def tree_size(path: str, limit: int = MAX_WALK_ENTRIES) -> int:
    """Bytes under `path` (allocated blocks), links not followed, at most `limit` entries."""
    total = 0
    seen = 0
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in (*dirs, *files):
            seen += 1
            if seen > limit:
                return total
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                total += st.st_blocks * 512
    return total


def scan(root: str) -> list[KeyDir]:
    """The key directories under `root` (real directories only, never a symlink)."""
    out: list[KeyDir] = []
    with os.scandir(root) as it:
        for entry in it:
            if not is_key_name(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            path = os.path.join(root, entry.name)
            try:
                used = os.lstat(os.path.join(path, STAMP_NAME)).st_mtime
            except OSError:
                used = entry.stat(follow_symlinks=False).st_mtime
            out.append(KeyDir(entry.name, tree_size(path), used))
    return out


def remove_key_dir(root: str, name: str) -> bool:
    """Delete `root/name` if it is still a real directory directly under `root`."""
    path = os.path.join(root, name)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not is_key_name(name) or os.path.dirname(path) != root:
        return False
    # shutil.rmtree unlinks symlinks inside instead of following them (and refuses a symlink root).
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def prune(root: str, current: str, max_gb: float) -> PrunePlan | None:
    """Apply `choose_prune` under `root`, logging what went. None when `root` cannot be read."""
    if os.path.islink(root):
        log.warning("engine.cache_scan_failed", root=root, error="a symlink: not followed")
        return None
    try:
        dirs = scan(root)
    except OSError as exc:
        log.warning("engine.cache_scan_failed", root=root, error=exc.strerror or str(exc))
        return None
    plan = choose_prune(dirs, current, int(max_gb * GIB) if max_gb > 0 else None)
    sizes = {d.name: d.size_bytes for d in dirs}
    for name in plan.remove:
        gone = remove_key_dir(root, name)
        log.info("engine.cache_pruned", key=name, bytes=sizes.get(name, 0), removed=gone,
                 root=root, max_gb=max_gb)
    if plan.over_with_current:
        log.warning("engine.cache_over_limit", key=current, bytes=sizes.get(current, 0),
                    max_gb=max_gb, hint="raise engine.cache_max_gb: the key in use is kept")
    return plan


def prepare(root: str, key: str, given: Mapping[str, str], *, max_gb: float,
            prune_now: bool) -> dict[str, str]:
    """Make and stamp `root/key`, prune the others when `prune_now`, and return the variables
    to add to the engine's environment ({} when the directory cannot be made)."""
    key_dir = os.path.join(root, key)
    try:
        os.makedirs(key_dir, mode=0o750, exist_ok=True)
        if os.path.islink(key_dir) or not os.path.isdir(key_dir):
            raise NotADirectoryError(key_dir)
        Path(key_dir, STAMP_NAME).touch()
    except OSError as exc:
        log.warning("engine.cache_unavailable", dir=key_dir, error=exc.strerror or str(exc),
                    hint="the engine keeps its libraries' default cache paths")
        return {}
    if prune_now:
        prune(root, key, max_gb)
    env = cache_env(key_dir, given)
    return env


def engine_cache_env(environ: Mapping[str, str], overlay: Mapping[str, str], *, configured: str | None,
                     max_gb: float, version: str, gpus: Iterable[tuple[str, str | None]],
                     torch: str | None, prune_now: bool) -> tuple[str | None, dict[str, str]]:
    """(key directory or None, the variables to add): the whole step, for the runner."""
    root = cache_root(environ, configured)
    if root is None:
        return None, {}
    key = cache_key(version, gpus, torch)
    env = prepare(root, key, {**environ, **overlay}, max_gb=max_gb, prune_now=prune_now)
    return (os.path.join(root, key) if env or os.path.isdir(os.path.join(root, key)) else None), env
