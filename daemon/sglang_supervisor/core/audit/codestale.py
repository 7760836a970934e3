"""The running supervisor's /status `code_stale`: a package upgrade replaced the installed code
but the unit still runs the old code it loaded at start (issue 28.3)."""

from __future__ import annotations

from typing import Any

from sglang_supervisor.core.audit.findings import Finding


def code_stale_findings(status: Any, unit: str) -> list[Finding]:
    """/status -> a warning with the restart that loads the installed code, when it says stale.

    The document is another process's answer: anything but `code_stale: true` says nothing."""
    if not isinstance(status, dict) or status.get("code_stale") is not True:
        return []
    running = status.get("supervisor_version")
    version = f" ({running})" if isinstance(running, str) and running else ""
    return [Finding(
        "warning", "live",
        f"{unit} runs supervisor code{version} older than the installed package",
        "a package upgrade replaced the files after the unit started; the running process keeps "
        "the code it loaded, so the upgrade's fixes are not in effect",
        f"systemctl restart {unit.removesuffix('.service')}",
        "live.code_stale")]
