"""Every structured event the supervisor logs is named `area.what_happened` (docs/ARCHITECTURE.md,
"Event names"): journal filters (`EVENT=profile.fallback`) and dashboards rely on one style, and
helpers adding events follow the rule this test enforces."""

from __future__ import annotations

import ast
import re
from pathlib import Path

DAEMON = Path(__file__).resolve().parents[2] / "daemon" / "sglang_supervisor"
EVENT_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
LOG_METHODS = {"debug", "info", "warning", "error", "critical", "exception", "msg"}
LOGGERS = {"log", "logger", "_log", "self.log"}


def _logger_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


def logged_event_names() -> dict[str, list[str]]:
    """event name -> where it is logged: structlog calls `log.info("name", ...)` and the
    policy's `Log("name", ...)` actions."""
    found: dict[str, list[str]] = {}
    for path in sorted(DAEMON.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            f = node.func
            # `(log.debug if quiet else log.info)("name", ...)` counts too
            branches = [f.body, f.orelse] if isinstance(f, ast.IfExp) else [f]
            is_log = all(isinstance(b, ast.Attribute) and b.attr in LOG_METHODS
                         and _logger_name(b.value) in LOGGERS for b in branches)
            is_action = isinstance(f, ast.Name) and f.id == "Log"
            if is_log or is_action:
                found.setdefault(first.value, []).append(f"{path.relative_to(DAEMON)}:{node.lineno}")
    return found


def test_every_event_name_is_dotted_snake_case() -> None:
    names = logged_event_names()
    assert len(names) > 40, sorted(names)  # the scan finds the events (it cannot pass on nothing)
    assert {"engine.launch", "profile.fallback", "supervisor.ready", "probe.failed"} <= set(names)
    bad = {n: where for n, where in names.items() if not EVENT_NAME.fullmatch(n)}
    assert not bad, f"event names must be area.what_happened (docs/ARCHITECTURE.md): {bad}"


def test_forwarded_engine_output_is_named_in_the_same_style() -> None:
    source = (DAEMON / "shell" / "telemetry" / "logsetup.py").read_text()
    assert '"EVENT": "engine.output"' in source and "engine_output" not in source
