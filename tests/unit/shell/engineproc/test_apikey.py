"""The API key: read from a file or a systemd credential, written 0600 for SGLang's --config."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from sglang_supervisor.core.config import ConfigError, EngineSettings
from sglang_supervisor.shell.engineproc.apikey import read_api_key, remove_secret_config, write_secret_config


def engine(**kw: str) -> EngineSettings:
    return EngineSettings(command=["python3"], model_path="/m", **kw)  # type: ignore[arg-type]


def test_no_key_configured() -> None:
    assert read_api_key(engine()) is None


def test_key_from_file_is_stripped(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("  sk-1234567890abcdef \n")
    assert read_api_key(engine(api_key_file=str(key))) == "sk-1234567890abcdef"


@pytest.mark.parametrize(("content", "words"), [("", "empty"), ("a\nb\n", "several lines")])
def test_bad_key_files(tmp_path: Path, content: str, words: str) -> None:
    key = tmp_path / "key"
    key.write_text(content)
    with pytest.raises(ConfigError) as info:
        read_api_key(engine(api_key_file=str(key)))
    assert info.value.problems[0].path == "engine.api_key_file"
    assert words in info.value.problems[0].problem


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_api_key(engine(api_key_file=str(tmp_path / "nope")))
    assert "No such file" in info.value.problems[0].problem


def test_key_from_systemd_credential(tmp_path: Path) -> None:
    (tmp_path / "sglang-api-key").write_text("sk-cred-0123456789abc\n")
    cfg = engine(api_key_credential="sglang-api-key")
    assert read_api_key(cfg, {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "sk-cred-0123456789abc"
    with pytest.raises(ConfigError) as info:
        read_api_key(cfg, {})
    assert info.value.problems[0].path == "engine.api_key_credential"
    assert "LoadCredential=sglang-api-key:" in info.value.problems[0].fix


def test_write_secret_config_is_0600_yaml_even_with_a_permissive_umask(tmp_path: Path) -> None:
    target = tmp_path / "run" / "engine.yaml"
    old = os.umask(0)
    try:
        write_secret_config(target, {"api-key": "sk-1"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert yaml.safe_load(target.read_text()) == {"api-key": "sk-1"}
    assert [p.name for p in target.parent.iterdir()] == ["engine.yaml"]  # no temp file left


def test_write_secret_config_replaces_atomically_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "engine.yaml"
    target.write_text("old: 1\n")
    target.chmod(0o644)
    write_secret_config(target, {"api-key": "sk-2"})
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert yaml.safe_load(target.read_text()) == {"api-key": "sk-2"}
    remove_secret_config(target)
    assert not target.exists()
    remove_secret_config(target)  # already gone: fine
    assert not target.exists()


def test_a_missing_credential_points_at_load_credential_not_chmod(tmp_path: Path) -> None:
    # $CREDENTIALS_DIRECTORY is systemd's read-only copy: chmod there is impossible and useless.
    cfg = engine(api_key_credential="sglang-api-key")
    with pytest.raises(ConfigError) as info:
        read_api_key(cfg, {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    problem = info.value.problems[0]
    assert problem.path == "engine.api_key_credential"
    assert "LoadCredential=sglang-api-key:" in problem.fix and "chmod 600" not in problem.fix
