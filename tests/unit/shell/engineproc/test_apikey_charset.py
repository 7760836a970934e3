"""An API key the supervisor cannot send is refused where it is read, not discovered by the first
HTTP call: httpx encodes header values as ASCII, so a key with `é` raised UnicodeEncodeError (a
ValueError none of the HTTP error handlers catch) -- building the gateway client at start, and in
every probe and health check of an engine with such a key."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sglang_supervisor.core.config import ConfigError, EngineSettings
from sglang_supervisor.core.secretforms import api_key_problem
from sglang_supervisor.shell.engineproc.apikey import read_api_key
from sglang_supervisor.shell.links.fleet import read_gateway_key

BAD = ["sk-0123456789abcdef-é", "sk-0123456789abcdef\x01x", "sk-0123456789abcdef\x7fx",
       "sk-0123456789\tabcdef"]


def test_the_premise_httpx_cannot_send_a_non_ascii_key() -> None:
    with pytest.raises(UnicodeEncodeError):
        httpx.AsyncClient(headers={"Authorization": f"Bearer {BAD[0]}"})


@pytest.mark.parametrize("key", BAD)
def test_a_key_that_is_not_printable_ascii_is_refused(key: str) -> None:
    problem = api_key_problem(key)
    assert problem is not None and "printable ASCII" in problem
    assert key not in problem


def test_printable_ascii_keys_with_quotes_and_symbols_are_fine() -> None:
    assert api_key_problem("sk-'q\"b\\s+l/a=s%h&-0123456789") is None


@pytest.mark.parametrize("key", BAD[:2])
def test_both_key_files_refuse_it(tmp_path: Path, key: str) -> None:
    f = tmp_path / "key"
    f.write_text(key + "\n", encoding="utf-8")
    f.chmod(0o600)
    with pytest.raises(ValueError, match="printable ASCII"):
        read_gateway_key(str(f))
    with pytest.raises(ConfigError) as info:
        read_api_key(EngineSettings(command=["python3"], model_path="/m", api_key_file=str(f)))  # type: ignore[arg-type]
    assert "printable ASCII" in str(info.value.problems[0])


@pytest.mark.parametrize(("content", "why"), [("admin", "5 characters long"), (BAD[0], "printable ASCII")])
def test_check_refuses_a_gateway_key_that_run_would_refuse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, why: str) -> None:
    # Everything `check` accepts, `run` can execute: `run` reads gateway.api_key_file at start.
    from sglang_supervisor import cli
    from sglang_supervisor.core.exitcodes import ExitCode
    from sglang_supervisor.shell.files.configfile import default_demo_config_path

    key = tmp_path / "gw-key"
    key.write_text(content + "\n", encoding="utf-8")
    key.chmod(0o600)
    gateway = f"gateway:\n  url: http://127.0.0.1:30080\n  api_key_file: {key}\n"
    text = default_demo_config_path().read_text() + gateway
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert cli.main(["check", "-c", str(cfg), "--sglang-version", "0.5.17"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "gateway.api_key_file" in err and why in err
    assert content not in err.replace(str(key), "")
