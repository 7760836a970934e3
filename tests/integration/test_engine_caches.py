"""The engine's kernel caches under the unit's CacheDirectory (issue 26), through the real daemon
and the simulator: the engine's own environment (read from /proc) holds every cache variable
under $CACHE_DIRECTORY/engine-cache/KEY, the operator's values (unit or engine.env) win, and an
old key folder beyond engine.cache_max_gb is pruned before the launch, with a log line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_supervisor.core.jitcache import CACHE_VAR_NAMES, CACHE_VARS, ENGINE_CACHE_SUBDIR
from supervised import base_config, start, stop_cleanly

pytestmark = pytest.mark.integration


def engine_environ(pid: int) -> dict[str, str]:
    out = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        k, sep, v = item.decode().partition("=")
        if sep:
            out[k] = v
    return out


@pytest.fixture
def no_cache_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*CACHE_VAR_NAMES, "CACHE_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)


def test_engine_caches_go_under_cache_directory_and_the_operator_wins(
        daemons, tmp_path: Path, no_cache_vars: None) -> None:
    cache = tmp_path / "var-cache"
    cache.mkdir()
    data = base_config(tmp_path)
    data["engine"]["env"]["TVM_FFI_CACHE_DIR"] = "/srv/config-tvm"  # the config's engine env
    d = start(daemons, tmp_path, data,
              env={"CACHE_DIRECTORY": str(cache), "TRITON_CACHE_DIR": "/srv/unit-triton"})  # the unit
    spawned = d.event("engine.spawned")
    placed = d.event("engine.cache_placed")
    env = engine_environ(spawned["pid"])
    keys = [p.name for p in (cache / ENGINE_CACHE_SUBDIR).iterdir()]
    assert len(keys) == 1 and keys[0].startswith("sglang-"), keys
    key_dir = str(cache / ENGINE_CACHE_SUBDIR / keys[0])
    assert placed["dir"] == key_dir
    assert env["TRITON_CACHE_DIR"] == "/srv/unit-triton"
    assert env["TVM_FFI_CACHE_DIR"] == "/srv/config-tvm"
    ours = [v for v, _ in CACHE_VARS if v not in ("TRITON_CACHE_DIR", "TVM_FFI_CACHE_DIR")]
    assert all(env[v].startswith(key_dir + "/") for v in ours), {v: env.get(v) for v in ours}
    assert env["CUDA_CACHE_MAXSIZE"] == str(4 << 30)
    assert set(placed["kept"]) == {"TRITON_CACHE_DIR", "TVM_FFI_CACHE_DIR"}
    d.notified("READY=1")
    stop_cleanly(d)


def test_an_old_key_folder_over_the_bound_is_pruned_before_the_launch(
        daemons, tmp_path: Path, no_cache_vars: None) -> None:
    cache = tmp_path / "var-cache"
    old = cache / ENGINE_CACHE_SUBDIR / "sglang-0.5.13_nvidia-a100-sm80"
    (old / "triton").mkdir(parents=True)
    (old / "triton" / "kernel.so").write_bytes(os.urandom(1 << 20))
    keep = cache / ENGINE_CACHE_SUBDIR / "not-a-key"  # never ours to delete
    keep.mkdir()
    data = base_config(tmp_path)
    data["engine"]["cache_max_gb"] = 0.0005  # ~0.5 MiB: the old 1 MiB folder must go
    d = start(daemons, tmp_path, data, env={"CACHE_DIRECTORY": str(cache)})
    pruned = d.event("engine.cache_pruned")
    d.event("engine.spawned")
    assert pruned["key"] == old.name and pruned["removed"] is True and pruned["bytes"] >= 1 << 20
    assert not old.exists() and keep.is_dir()
    d.notified("READY=1")
    stop_cleanly(d)


def test_without_cache_directory_nothing_is_set(daemons, tmp_path: Path, no_cache_vars: None) -> None:
    d = start(daemons, tmp_path, base_config(tmp_path))
    env = engine_environ(d.event("engine.spawned")["pid"])
    assert not [v for v in CACHE_VAR_NAMES if v in env]
    assert not d.named("engine.cache_placed")
    stop_cleanly(d)
