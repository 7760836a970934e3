"""The engine's environment: the venv's bin directory on PATH (as `activate` does), systemd's
notify variables gone."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.shell.engineproc.process import venv_bin_dir


def test_the_engine_venv_bin_goes_first_on_path_once() -> None:
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "NOTIFY_SOCKET": "/run/x"}
    env = engine_env(base, {"FOO": "1"}, "/opt/sglang/.venv/bin")
    assert env["PATH"] == "/opt/sglang/.venv/bin:/usr/local/bin:/usr/bin:/bin"
    assert "NOTIFY_SOCKET" not in env and env["FOO"] == "1"
    again = engine_env({"PATH": env["PATH"]}, {}, "/opt/sglang/.venv/bin")
    assert again["PATH"] == env["PATH"]


def test_without_a_venv_path_is_left_alone() -> None:
    assert engine_env({"PATH": "/usr/bin"}, {}, None)["PATH"] == "/usr/bin"
    assert engine_env({}, {}, "/v/bin")["PATH"] == "/v/bin"


def test_a_profile_path_is_the_one_extended() -> None:
    env = engine_env({"PATH": "/usr/bin"}, {"PATH": "/custom/bin"}, "/v/bin")
    assert env["PATH"] == "/v/bin:/custom/bin"


def test_venv_bin_dir_needs_pyvenv_cfg_and_keeps_symlinks(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3")
    assert venv_bin_dir(str(venv / "bin" / "python3")) == str(venv / "bin")
    assert venv_bin_dir(str(tmp_path / "bin" / "python3")) is None  # no pyvenv.cfg: not a venv
    assert venv_bin_dir("python3") is None  # relative: resolved by PATH already
