"""`sglang-supervisor upgrade` (issue 24): bad input is a clear error naming the fix, never a
traceback: no candidate named (exit 2), a candidate interpreter that does not exist (exit 78)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor import cli
from sglang_supervisor.shell.files.configfile import default_demo_config_path


def demo_copy(tmp_path: Path) -> Path:
    import yaml
    data = yaml.safe_load(default_demo_config_path().read_text())
    data["state_dir"] = str(tmp_path / "state")
    text = yaml.safe_dump(data)
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    return path


def test_no_candidate_named_is_a_usage_error_with_the_fix(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["upgrade", "--config", str(demo_copy(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "no candidate release named" in err and "--to" in err and "engine.candidate.python" in err


def test_a_missing_candidate_interpreter_names_the_second_venv_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere" / "bin" / "python")
    assert cli.main(["upgrade", "--config", str(demo_copy(tmp_path)), "--to", missing,
                     "--check"]) == 78
    err = capsys.readouterr().err
    assert missing in err and "python3 -m venv" in err and "Traceback" not in err


def test_check_and_now_are_one_choice(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["upgrade", "--config", str(demo_copy(tmp_path)), "--check", "--now"])
    assert exc.value.code == 2
