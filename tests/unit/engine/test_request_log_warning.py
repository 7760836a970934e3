"""`render`/`check` warn about --log-requests in the text form: SGLang prints request dict keys
unescaped there, so an API user can forge engine lines (tests/unit/core/test_logwatch_forged_keys.py)."""

from __future__ import annotations

import json
import os

import pytest

from sglang_supervisor.engine.migrate import stdout_log_handlers
from sglang_supervisor.engine.sglang import migrate_args, migrate_env
from sglang_supervisor.shell.files.configfile import logging_config_problems


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


STDOUT_CONFIG = {"version": 1, "handlers": {
    "console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"},
    "err": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
    "root": {"handlers": ["console", "err"]}}


def test_run_refuses_a_logging_config_that_sends_sglangs_log_to_stdout(tmp_path) -> None:
    path = tmp_path / "logging.json"
    path.write_text(json.dumps(STDOUT_CONFIG))
    errors, warnings = logging_config_problems(
        {"tuned": {"SGLANG_LOGGING_CONFIG_PATH": str(path)}, "eager": {}}, {})
    [e] = errors
    assert e.path == "profiles.tuned.env.SGLANG_LOGGING_CONFIG_PATH" and "console" in e.problem
    assert "ext://sys.stderr" in e.fix and warnings == []


def test_run_accepts_a_logging_config_that_keeps_sglangs_log_on_stderr(tmp_path) -> None:
    path = tmp_path / "logging.json"
    ok = dict(STDOUT_CONFIG, handlers={"err": STDOUT_CONFIG["handlers"]["err"]})
    path.write_text(json.dumps(ok))
    assert logging_config_problems({"tuned": {"SGLANG_LOGGING_CONFIG_PATH": str(path)}}, {}) == (
        [], [])


def test_the_supervisors_own_environment_is_checked_too(tmp_path) -> None:
    path = tmp_path / "logging.json"
    path.write_text(json.dumps(STDOUT_CONFIG))
    errors, _ = logging_config_problems({"tuned": {}}, {"SGLANG_LOGGING_CONFIG_PATH": str(path)})
    assert [e.path for e in errors] == ["SGLANG_LOGGING_CONFIG_PATH (the supervisor's environment)"]


def test_a_logging_config_that_cannot_be_read_is_warned_about_without_blocking(tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would never return
    envs = {"a": {"SGLANG_LOGGING_CONFIG_PATH": str(fifo)},
            "b": {"SGLANG_LOGGING_CONFIG_PATH": str(tmp_path / "missing.json")}}
    errors, warnings = logging_config_problems(envs, {})
    assert errors == [] and len(warnings) == 2 and all("cannot check" in w.problem for w in warnings)


@pytest.mark.parametrize(("text", "handlers"), [
    (json.dumps(STDOUT_CONFIG), ["console"]),
    ('{"version": 1}', []),
    ("not json", None),
    ("[1, 2]", None),
])
def test_stdout_log_handlers(text: str, handlers: list[str] | None) -> None:
    assert stdout_log_handlers(text) == handlers
