"""Issue 29.4: state, config and credential files another user can write are refused with the
fix (like ssh's StrictModes), at `check`, `run`, `doctor` and a reload; nothing is moved or lost."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sglang_supervisor.core.config import ConfigError
from sglang_supervisor.core.filetrust import FileFacts, Trusted, trust_problem
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.files.state import StateStore

REG = stat.S_IFREG
DIR = stat.S_IFDIR
ME = Trusted.for_process(1000, 1000, None)


def problem(mode: int, uid: int = 1000, gid: int = 1000, trusted: Trusted = ME) -> str | None:
    p = trust_problem("remembered profiles", FileFacts("/s/q.state.json", mode, uid, gid), trusted)
    return None if p is None else f"{p.problem} | {p.fix}"


@pytest.mark.parametrize(("mode", "uid", "gid", "expected"), [
    (REG | 0o640, 1000, 1000, None),
    (REG | 0o644, 0, 0, None),  # root's file
    (REG | 0o664, 1000, 1000, None),  # group-writable by our own (user-private) group
    (REG | 0o666, 1000, 1000, "writable by every user (mode 0666) | chmod o-w /s/q.state.json"),
    (DIR | 0o777, 1000, 1000, "anyone could replace the files in it | chmod o-w /s/q.state.json"),
    (DIR | 0o1777, 1000, 1000, "mode 1777"),  # sticky: others still create what is missing
    (REG | 0o664, 1000, 4343, "writable by group gid 4343 (mode 0664)"),
    (REG | 0o600, 4242, 1000, "owned by uid 4242, neither root nor this user (uid 1000)"),
])
def test_the_rule(mode: int, uid: int, gid: int, expected: str | None) -> None:
    got = problem(mode, uid, gid)
    if expected is None:
        assert got is None
    else:
        assert got is not None and expected in got, got


def test_the_owner_fix_names_the_chown() -> None:
    got = problem(REG | 0o600, 4242)
    assert got is not None and "chown 1000 /s/q.state.json" in got


def test_root_trusts_the_service_user_who_owns_the_state_directory() -> None:
    root = Trusted.for_process(0, 0, (998, 998))  # `sudo sglang-supervisor check`
    assert problem(REG | 0o640, 998, 998, root) is None
    assert problem(REG | 0o660, 998, 998, root) is None
    assert problem(REG | 0o640, 4242, 998, root) is not None
    assert problem(REG | 0o666, 998, 998, root) is not None


def config_text(tmp_path: Path, **engine: str) -> str:
    extra = "".join(f"  {k}: {v}\n" for k, v in engine.items())
    return (f"state_dir: {tmp_path / 'state'}\n"
            "engine:\n  command: [sglang, serve]\n  model_path: Qwen/Qwen3-8B\n"
            f"  version: 0.5.23\n{extra}"
            "profiles:\n  - name: tuned\n")


def write_config(tmp_path: Path, **engine: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(config_text(tmp_path, **engine))
    path.chmod(0o640)
    return path


def refused(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return [f"{p.path}: {p.problem} | {p.fix}" for p in info.value.problems]


def test_a_state_file_writable_by_others_is_refused_and_kept(tmp_path: Path) -> None:
    """The attack of issue 29: a forged known-bad entry made the healthy first profile be skipped."""
    config = write_config(tmp_path)
    store = StateStore(tmp_path / "state", None)
    store.mark_bad("fp", "tuned", "capture_oom", 1.0)
    assert isinstance(load_config(config).state_dir, str)  # trusted as written
    state_file = tmp_path / "state" / "state.json"
    content = state_file.read_bytes()
    state_file.chmod(0o666)
    (line,) = refused(config)
    assert line.startswith("state_dir: ") and str(state_file) in line and "0666" in line
    assert line.endswith(f"chmod o-w {state_file}")
    assert state_file.read_bytes() == content  # nothing moved aside or rewritten
    assert sorted(os.listdir(tmp_path / "state")) == ["state.json", "state.json.lock"]


def test_a_state_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state").chmod(0o777)
    (line,) = refused(config)
    assert "the state directory" in line and f"chmod o-w {tmp_path / 'state'}" in line


def test_a_gateway_record_writable_by_others_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "state").mkdir()
    record = tmp_path / "state" / "gateway.json"
    record.write_text("{}")
    record.chmod(0o646)
    (line,) = refused(config)
    assert "gateway registration" in line and f"chmod o-w {record}" in line


def test_a_key_file_writable_by_others_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o602)  # not readable by others (that rule is older), but writable
    config = write_config(tmp_path, api_key_file=str(key))
    (line,) = refused(config)
    assert line.startswith("engine.api_key_file: ") and "an API key" in line
    assert line.endswith(f"chmod o-w {key}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a file to another owner")
def test_a_state_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    StateStore(tmp_path / "state", None).mark_good("fp", "tuned", 1.0)
    os.chown(tmp_path / "state" / "state.json", 4242, 0)
    (line,) = refused(config)
    assert "owned by uid 4242" in line and "chown 0 " in line


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another owner")
def test_root_accepts_the_service_users_own_state(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    StateStore(tmp_path / "state", None).mark_good("fp", "tuned", 1.0)
    for p in (tmp_path / "state", tmp_path / "state" / "state.json"):
        os.chown(p, 4242, 4343)
    assert load_config(config).state_dir == str(tmp_path / "state")
