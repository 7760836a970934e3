"""Escaped spellings of the API key are redacted too; keys too short to redact are refused."""

from __future__ import annotations

import io
import json
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor import cli
from sglang_supervisor.core.config import ConfigError, EngineSettings
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.logwatch import LogParser
from sglang_supervisor.core.secretforms import MIN_API_KEY_LEN, api_key_problem, escaped_forms
from sglang_supervisor.shell.engineproc.apikey import read_api_key
from sglang_supervisor.shell.engineproc.enginelog import StreamRedactor
from sglang_supervisor.shell.telemetry import logsetup
from sglang_supervisor.simulator import reqlog

# A key with every character an escaping changes: quote, backslash, URL specials, non-ASCII.
KEY = "sk-'q\"b\\s+l/a=s%h&é-0123456789"


def _printed(key: str) -> list[str]:
    """The ways SGLang and its users print the key."""
    return [
        f"server_args=ServerArgs(model_path='m', api_key={key!r}, port=1)",
        "server_args=" + repr({"api_key": key, "tp_size": 1}),
        json.dumps({"api_key": key, "launch_command": f"sglang serve --api-key {key}"}),
        json.dumps({"api_key": key}, ensure_ascii=False),
        f'INFO:     127.0.0.1:1 - "GET /v1/models?api_key={quote(key, safe="")} HTTP/1.1" 401',
        f'INFO:     127.0.0.1:1 - "GET /v1/models?k={quote_plus(key)} HTTP/1.1" 401',
        "Receive: obj=" + reqlog.to_text(reqlog.generate_req("r", f"my key is {key}", {}), 2048),
    ]


@pytest.mark.parametrize("line", _printed(KEY))
def test_every_printed_form_is_redacted_by_the_engine_log_file_and_the_parser(line: str) -> None:
    r = StreamRedactor([KEY])
    out = (r.feed(line.encode()) + r.flush()).decode()
    assert "***" in out
    for form in escaped_forms(KEY):
        assert form not in out
    assert "0123456789" not in out  # nothing of the key survives, in no spelling
    parser = LogParser(secrets=[KEY])
    events = parser.feed_line("Traceback (most recent call last): " + line)
    assert "0123456789" not in repr(events)


@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=MIN_API_KEY_LEN, max_size=40))
def test_any_key_in_any_printed_form_is_gone(key: str) -> None:
    r = StreamRedactor([key])
    for line in _printed(key):
        out = (r.feed(line.encode()) + r.flush()).decode()
        assert key not in out
        assert repr(key)[1:-1] not in out and json.dumps(key)[1:-1] not in out


def test_the_supervisor_log_redacts_the_forms() -> None:
    buf = io.StringIO()
    logsetup.configure_logging("journald", buf, native_journal=False)
    try:
        logsetup.set_redactions([KEY])
        for line in _printed(KEY):
            structlog.get_logger().info("engine_args", text=line)
            logsetup.log_engine_line(line, 6)
    finally:
        logsetup.set_redactions([])
        logsetup.configure_logging("journald", io.StringIO(), native_journal=False)
    out = buf.getvalue()
    assert out.count("***") >= 2 * len(_printed(KEY)) and "0123456789" not in out


@pytest.mark.parametrize("key", ["", "a", "hunter2", "x" * (MIN_API_KEY_LEN - 1)])
def test_short_keys_are_refused_with_the_fix(tmp_path: Path, key: str) -> None:
    if key:
        assert api_key_problem(key) is not None
    f = tmp_path / "key"
    f.write_text(key + "\n")
    with pytest.raises(ConfigError) as info:
        read_api_key(EngineSettings(command=["python3"], model_path="/m", api_key_file=str(f)))  # type: ignore[arg-type]
    text = str(info.value.problems[0])
    assert ("characters long" in text and "openssl rand" in text) or "empty" in text
    assert api_key_problem("x" * MIN_API_KEY_LEN) is None


def test_check_exits_78_for_a_short_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_supervisor.shell.files.configfile import default_demo_config_path
    key = tmp_path / "key"
    key.write_text("admin\n")
    key.chmod(0o600)
    text = default_demo_config_path().read_text().replace("engine:\n", f"engine:\n  api_key_file: {key}\n", 1)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert cli.main(["check", "-c", str(cfg), "--sglang-version", "0.5.17"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "engine.api_key_file" in err and "5 characters long" in err and "openssl rand -hex 24" in err
    assert "admin" not in err.replace(str(key), "")
