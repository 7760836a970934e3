"""`sglang-supervisor status [--all] [--json]`: every model on this host at a glance: its unit,
phase, profile (and whether it is the best), tok/s against the baseline, time below best, last
failure (class, profile, log line), the way back, gateway registration, the GPUs and their memory,
and whether it still runs code older than the installed package.

Each running supervisor is asked for its `/status` on `metrics.address` (bounded: 2 s, 1 MiB);
the unit state comes from `systemctl show`. Nothing here needs root beyond reading the
configurations."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from sglang_supervisor.core.address import parse_address
from sglang_supervisor.core.config import ConfigError
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.statusview import model_row, table
from sglang_supervisor.shell.checks.enginehttp import EngineAnswerError, fetch_sync
from sglang_supervisor.shell.files.configfile import load_config

STATUS_DEADLINE_S = 2.0
STATUS_MAX_BYTES = 1 << 20
_WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def _unit_state(name: str) -> tuple[str, str]:
    """(unit, ActiveState) of the model's unit: sglang-NAME.service, else the template instance."""
    systemctl = shutil.which("systemctl")
    candidates = (f"sglang-{name}.service", f"sglang-supervisor@{name}.service")
    if systemctl is None:
        return candidates[0], "unknown"
    for unit in candidates:
        try:
            out = subprocess.run([systemctl, "show", "-p", "LoadState,ActiveState", "--value", unit],
                                 capture_output=True, text=True, timeout=5, check=False).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            return unit, "unknown"
        if len(out) == 2 and out[0] != "not-found":
            return unit, out[1]
    return candidates[0], "not-found"


def _status_doc(client: httpx.Client, address: str) -> tuple[dict[str, Any] | None, str | None]:
    host, port = parse_address(address)
    host = _WILDCARD_TO_LOOPBACK.get(host, host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/status"
    try:
        answer = fetch_sync(client, url, deadline_s=STATUS_DEADLINE_S, max_bytes=STATUS_MAX_BYTES)
    except EngineAnswerError as exc:
        return None, f"no /status: {exc}"
    if answer.status != 200:
        return None, f"{url} answered {answer.status}"
    try:
        doc = json.loads(bytes(answer.body))
    except (ValueError, UnicodeDecodeError):
        return None, f"{url} answered something that is not JSON"
    return (doc, None) if isinstance(doc, dict) else (None, f"{url} answered JSON that is not an object")


def _row(client: httpx.Client, path: Path) -> dict[str, Any]:
    try:
        config = load_config(path, on_warning=lambda _w: None)
    except ConfigError as exc:
        first = exc.problems[0].problem if exc.problems else "invalid"
        return model_row(path.stem, f"sglang-{path.stem}.service", _unit_state(path.stem)[1], None,
                         problem=f"{path}: {first} (sglang-supervisor check --config {path})", best=None)
    unit, state = _unit_state(config.name)
    best = config.profile_names[0]
    if not config.metrics.enabled:
        return model_row(config.name, unit, state, None, problem="metrics.enabled is false: no /status",
                         best=best)
    doc, problem = _status_doc(client, config.metrics.address)
    if doc is None and state not in ("active", "activating", "reloading", "deactivating"):
        problem = None  # a stopped unit has no /status: nothing to explain
    return model_row(config.name, unit, state, doc, problem=problem, best=best)


def main(args: argparse.Namespace) -> int:
    if args.all:
        directory = Path(args.config_dir)
        paths = sorted(p for p in directory.glob("*.yaml") if p.is_file())
        if not paths:
            print(f"sglang-supervisor status: no configurations in {directory} (--config-dir DIR)",
                  file=sys.stderr)
            return ExitCode.CONFIG
    else:
        paths = [Path(args.config)]
    with httpx.Client() as client:
        rows = [_row(client, p) for p in paths]
    if args.json:
        print(json.dumps({"models": rows}, indent=2))
    else:
        print(table(rows, time.time()))
    return ExitCode.OK
