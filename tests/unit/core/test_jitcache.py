"""The kernel-cache policy (core/jitcache.py) and its disk step (shell/engineproc/jitcache.py): the key per
release, torch and GPU; the variables placed unless the operator set them; the least recently
used key folders pruned to the bound, never the one in use, never outside the cache root, never
through a symlink (issue 26)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_supervisor.core.config import ConfigError, parse_config
from sglang_supervisor.core.jitcache import (
    CACHE_VARS,
    STAMP_NAME,
    KeyDir,
    cache_env,
    cache_key,
    choose_prune,
    is_key_name,
)
from sglang_supervisor.shell.engineproc import jitcache as disk

H200 = ("NVIDIA H200", "9.0")
GIB = 1 << 30


def test_the_key_names_release_torch_and_gpu() -> None:
    key = cache_key("0.5.17", [H200], "2.9.1+cu128")
    assert key == "sglang-0.5.17_torch-2.9.1+cu128_nvidia-h200-sm90"
    assert cache_key("0.5.17", [H200]) == "sglang-0.5.17_nvidia-h200-sm90"
    keys = {cache_key("0.5.17", [H200]), cache_key("0.5.23", [H200]),
            cache_key("0.5.17", [("NVIDIA H100 80GB HBM3", "9.0")]),
            cache_key("0.5.17", [("NVIDIA B200", "10.0")]),
            cache_key("0.5.17", [H200], "2.8.0")}
    assert len(keys) == 5  # every difference is another folder


def test_the_key_is_one_safe_path_component() -> None:
    key = cache_key("../../etc", [("GPU/../x y", None)], "a/b")
    assert "/" not in key and ".." not in key and is_key_name(key)
    assert cache_key("0.5.17", []) == "sglang-0.5.17_gpu-unknown"
    # several models: one name each, in a stable order; the same model twice once
    assert cache_key("0.5.17", [("B", "9.0"), ("A", "8.0"), ("B", "9.0")]) == "sglang-0.5.17_a-sm80+b-sm90"


def test_key_names_are_recognised_and_nothing_else() -> None:
    assert is_key_name("sglang-0.5.17_nvidia-h200-sm90")
    for name in ("huggingface", "triton", "sglang-", "sglang-x/y", "sglang-X", ".sglang-1",
                 "sglang-" + "a" * 200):
        assert not is_key_name(name), name


def test_every_cache_variable_goes_under_the_key_folder() -> None:
    env = cache_env("/var/cache/s/engine-cache/k", {})
    assert {v for v, _ in CACHE_VARS} <= set(env)
    assert all(env[v].startswith("/var/cache/s/engine-cache/k/") for v, _ in CACHE_VARS)
    assert env["SGLANG_DG_CACHE_DIR"] == env["DG_JIT_CACHE_DIR"]  # SGLang copies one into the other
    assert env["CUDA_CACHE_MAXSIZE"] == str(4 << 30)


def test_a_variable_the_operator_set_is_not_touched() -> None:
    env = cache_env("/k", {"TRITON_CACHE_DIR": "/fast/triton", "CUDA_CACHE_MAXSIZE": "1024"})
    assert "TRITON_CACHE_DIR" not in env and "CUDA_CACHE_MAXSIZE" not in env
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/k/torchinductor"


def kd(name: str, gib: float, used: float) -> KeyDir:
    return KeyDir(name, int(gib * GIB), used)


@pytest.mark.parametrize(("dirs", "current", "max_gib", "remove", "over"), [
    # under the bound: nothing
    ([kd("sglang-a", 5, 1), kd("sglang-b", 5, 2)], "sglang-b", 20, (), False),
    # the least recently used first, only as many as needed
    ([kd("sglang-a", 10, 3), kd("sglang-b", 10, 1), kd("sglang-c", 10, 2), kd("sglang-d", 5, 4)],
     "sglang-d", 20, ("sglang-b", "sglang-c"), False),
    # the key in use is never removed, even when it is the oldest
    ([kd("sglang-cur", 15, 0), kd("sglang-x", 10, 5)], "sglang-cur", 20, ("sglang-x",), False),
    # the key in use alone is over the bound: the others go, it stays, and that is said
    ([kd("sglang-cur", 30, 9), kd("sglang-x", 1, 1)], "sglang-cur", 20, ("sglang-x",), True),
    # no bound
    ([kd("sglang-a", 500, 1)], "sglang-b", None, (), False),
])
def test_choose_prune(dirs: list[KeyDir], current: str, max_gib: float | None, remove: tuple[str, ...],
                      over: bool) -> None:
    plan = choose_prune(dirs, current, None if max_gib is None else int(max_gib * GIB))
    assert plan.remove == remove and plan.over_with_current is over
    assert plan.kept_bytes == plan.total_bytes - sum(d.size_bytes for d in dirs if d.name in remove)


def make_key(root: Path, name: str, size: int, used: float) -> Path:
    d = root / name
    (d / "triton").mkdir(parents=True)
    (d / "triton" / "k.bin").write_bytes(os.urandom(size))
    (d / STAMP_NAME).touch()
    os.utime(d / STAMP_NAME, (used, used))
    return d


def test_prune_on_disk_removes_old_keys_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "engine-cache"
    old = make_key(root, "sglang-0.5.13_a100", 1 << 20, 1000)
    mid = make_key(root, "sglang-0.5.14_a100", 1 << 20, 2000)
    cur = make_key(root, "sglang-0.5.17_h200", 1 << 20, 3000)
    (root / "notes").mkdir()  # not a key: never deleted
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_bytes(os.urandom(4 << 20))
    (root / "sglang-link").symlink_to(outside)  # a symlink named like a key: neither followed nor removed
    (cur / "triton" / "escape").symlink_to(outside)  # not counted, not followed
    plan = disk.prune(str(root), cur.name, max_gb=2.5 / 1024)  # 2.5 MiB: one old folder must go
    assert plan is not None and plan.remove == (old.name,)
    assert not old.exists() and mid.is_dir() and cur.is_dir() and (root / "notes").is_dir()
    assert (root / "sglang-link").is_symlink() and (outside / "data").stat().st_size == 4 << 20
    assert plan.total_bytes < 4 << 20  # the 4 MiB behind the symlinks were not counted


def test_remove_key_dir_refuses_a_symlink_and_a_non_key(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "sglang-a").symlink_to(target)
    (root / "other").mkdir()
    assert not disk.remove_key_dir(str(root), "sglang-a")
    assert not disk.remove_key_dir(str(root), "other")
    assert (target / "f").exists() and (root / "other").is_dir()


def test_a_symlinked_cache_root_is_not_pruned(tmp_path: Path) -> None:
    real = tmp_path / "real"
    make_key(real, "sglang-old", 1 << 20, 1)
    (tmp_path / "root").symlink_to(real)
    assert disk.prune(str(tmp_path / "root"), "sglang-new", max_gb=1e-9) is None
    assert (real / "sglang-old").is_dir()


def test_cache_root_is_the_config_or_the_units_cache_directory() -> None:
    two = {"CACHE_DIRECTORY": "/var/cache/a:/var/cache/b"}  # CacheDirectory= with two paths
    assert disk.cache_root(two, None) == "/var/cache/a/engine-cache"
    assert disk.cache_root({"CACHE_DIRECTORY": "/var/cache/a"}, "/srv/c") == "/srv/c/engine-cache"
    assert disk.cache_root({}, None) is None
    assert disk.cache_root({"CACHE_DIRECTORY": "relative"}, None) is None


def test_prepare_makes_and_stamps_the_key_and_never_blocks_a_launch(tmp_path: Path) -> None:
    env = disk.prepare(str(tmp_path / "engine-cache"), "sglang-k", {}, max_gb=20, prune_now=True)
    assert (tmp_path / "engine-cache" / "sglang-k" / STAMP_NAME).is_file()
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "engine-cache" / "sglang-k" / "triton")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert disk.prepare(str(blocker / "engine-cache"), "sglang-k", {}, max_gb=20, prune_now=True) == {}


def test_torch_version_from_the_engine_venv(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    (site / "torch-2.9.1+cu128.dist-info").mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    assert disk.torch_version(str(tmp_path / "venv" / "bin" / "python3")) == "2.9.1+cu128"
    assert disk.torch_version(str(tmp_path / "nowhere" / "bin" / "python3")) is None


BASE = ("engine:\n  command: [python3]\n  model_path: m\n  version: \"0.5.23\"\n{extra}"
        "profiles:\n  - name: a\n")


@pytest.mark.parametrize(("line", "problem"), [
    ("cache_dir: relative/dir", "engine.cache_dir"),
    ("cache_max_gb: -1", "engine.cache_max_gb"),
])
def test_cache_keys_are_checked(line: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE.format(extra=f"  {line}\n"), "t.yaml")
    assert problem in str(err.value)


def test_cache_key_defaults() -> None:
    cfg = parse_config(BASE.format(extra=""), "t.yaml")
    assert cfg.engine.cache_dir is None and cfg.engine.cache_max_gb == 20
