"""`render`/`check` warn about --log-requests in the text form: SGLang prints request dict keys
unescaped there, so an API user can forge engine lines (tests/unit/test_logwatch_forged_keys.py)."""

from __future__ import annotations

import pytest

from sglang_supervisor.engine.sglang import migrate_args, migrate_env


def warned(args: list[str], version: str = "0.5.23") -> bool:
    return any(p.flag == "--log-requests" and p.severity == "warning"
               for p in migrate_args(args, version).problems)


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("args", [
    ["--log-requests"],  # SGLang's defaults: level 2, text, stdout
    ["--log-requests", "--log-requests-level", "1"],
    ["--log-requests", "--log-requests-level=3", "--log-requests-format", "text"],
    ["--log-requests", "--log-requests-target", "stdout", "/var/log/req"],
])
def test_text_form_request_logs_to_the_output_are_warned_about(args: list[str], version: str) -> None:
    assert warned(args, version)


@pytest.mark.parametrize("args", [
    [],
    ["--log-requests", "--log-requests-format", "json"],
    ["--log-requests", "--log-requests-level", "0"],  # no dicts with user keys at level 0
    ["--log-requests", "--log-requests-target", "/var/log/sglang-requests"],
])
def test_safe_request_logging_is_not_warned_about(args: list[str]) -> None:
    assert not warned(args)


def test_the_warning_names_the_fix() -> None:
    [p] = [p for p in migrate_args(["--log-requests"], "0.5.23").problems if p.flag == "--log-requests"]
    assert "--log-requests-format json" in p.fix


def test_a_logging_config_of_its_own_is_warned_about() -> None:
    # SGLang's own log must stay on stderr: the supervisor parses only that stream.
    m = migrate_env({"SGLANG_LOGGING_CONFIG_PATH": "/etc/sglang/logging.json"}, "0.5.23")
    [p] = [p for p in m.warnings if p.flag == "SGLANG_LOGGING_CONFIG_PATH"]
    assert p.severity == "warning" and "ext://sys.stderr" in p.fix
    assert m.env["SGLANG_LOGGING_CONFIG_PATH"] == "/etc/sglang/logging.json"  # kept, only warned
    assert migrate_env({"SGLANG_LOG_MS": "1"}, "0.5.23").warnings == []
