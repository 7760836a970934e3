"""groupsecret.py: the group link's secret is read only from a file no other user can read or
change (ssh's rule for private keys), or from the systemd credential; errors name the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_supervisor.core.config import ConfigError
from sglang_supervisor.core.group import GroupSettings
from sglang_supervisor.shell.links.groupsecret import read_group_secret

SECRET = "9f" * 32
BASE = {"nnodes": 2, "dist_init_addr": "127.0.0.1:5000", "link": "127.0.0.1:5001"}


def secret_file(tmp_path: Path, text: str = SECRET, mode: int = 0o600) -> Path:
    path = tmp_path / "group.secret"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def settings(**kw: str) -> GroupSettings:
    return GroupSettings.model_validate({**BASE, **kw})


def problem(s: GroupSettings, environ: dict[str, str] | None = None) -> tuple[str, str, str]:
    with pytest.raises(ConfigError) as err:
        read_group_secret(s, environ or {})
    (p,) = err.value.problems
    assert SECRET not in p.problem and SECRET not in p.fix  # never quoted
    return p.path, p.problem, p.fix


def test_an_owner_only_file_is_read(tmp_path: Path) -> None:
    path = secret_file(tmp_path)
    assert read_group_secret(settings(secret_file=str(path)), {}) == SECRET.encode()
    path.chmod(0o640)  # group-readable with a dedicated group, as for the API key
    assert read_group_secret(settings(secret_file=str(path)), {}) == SECRET.encode()


@pytest.mark.parametrize(("mode", "needle"), [(0o644, "mode 0644"), (0o604, "mode 0604"),
                                              (0o620, "mode 0620"), (0o666, "mode 0666")])
def test_a_file_others_can_read_or_change_is_refused_with_the_chmod(tmp_path: Path, mode: int,
                                                                    needle: str) -> None:
    path = secret_file(tmp_path, mode=mode)
    key, text, fix = problem(settings(secret_file=str(path)))
    assert key == "group.secret_file" and needle in text and f"chmod 600 {path}" in fix


def test_a_missing_file_says_how_to_create_it(tmp_path: Path) -> None:
    key, text, fix = problem(settings(secret_file=str(tmp_path / "nope")))
    assert key == "group.secret_file" and "cannot read" in text and "openssl rand -hex 32" in fix


@pytest.mark.parametrize(("text", "needle"), [("short", "at least 32"), ("", "is empty")])
def test_a_weak_secret_is_refused(tmp_path: Path, text: str, needle: str) -> None:
    path = secret_file(tmp_path, text)
    assert needle in problem(settings(secret_file=str(path)))[1]


def test_a_directory_is_not_a_secret(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    assert "not a regular file" in problem(settings(secret_file=str(tmp_path / "d")))[1]


def test_the_systemd_credential(tmp_path: Path) -> None:
    secret_file(tmp_path, mode=0o400)
    s = settings(secret_credential="group.secret")
    assert read_group_secret(s, {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == SECRET.encode()
    key, text, fix = problem(s, {})
    assert key == "group.secret_credential" and "CREDENTIALS_DIRECTORY" in text
    assert "LoadCredential=group.secret:" in fix


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_a_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = secret_file(tmp_path)
    os.chown(path, 4242, 4242)
    assert "owned by uid 4242" in problem(settings(secret_file=str(path)))[1]


@pytest.mark.parametrize(("mode", "code"), [(0o600, 0), (0o644, 78)])
def test_check_reads_the_secret_as_run_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            mode: int, code: int) -> None:
    from sglang_supervisor import cli
    from sglang_supervisor.shell.files.configfile import default_demo_config_path

    path = secret_file(tmp_path, mode=mode)
    group = ("group:\n  nnodes: 2\n  dist_init_addr: 127.0.0.1:5000\n  link: 127.0.0.1:5001\n"
             f"  secret_file: {path}\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(default_demo_config_path().read_text() + group)
    assert cli.main(["check", "-c", str(cfg), "--sglang-version", "0.5.17"]) == code
    err = capsys.readouterr().err
    assert SECRET not in err
    if code:
        assert "group.secret_file" in err and f"chmod 600 {path}" in err
