"""`sglang-supervisor upgrade`: a candidate SGLang release, installed as a second venv, checked
against every profile before any GPU time (`--check`), then put on trial by the running daemon
(`--now`, `--retry`): the upgrade canary (docs/OPERATIONS.md, "Upgrading SGLang").

`--now` leaves the candidate in `state_dir/NAME.upgrade.json` and sends SIGHUP to the daemon (its
pid from `/status` on `metrics.address`; else it says to run `systemctl reload`): the daemon's
reload drains and stops the engine, starts the candidate with the current profile, compares its
READY probe with the current release's, and promotes or rolls back.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import httpx

from sglang_supervisor.commands.loadconfig import load_or_report
from sglang_supervisor.core.config import Config, ConfigError
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.upgradeplan import UpgradePlan, plan_text
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell.upgradecheck import check_candidate
from sglang_supervisor.shell.upgrades import startup_config, write_request

STATUS_TIMEOUT_S = 5.0


def _daemon_pid(config: Config) -> int | None:
    """The running daemon's pid, from its /status (None when metrics are off, nobody answers,
    or the address is off loopback and the pid is redacted)."""
    if not config.metrics.enabled:
        return None
    try:
        r = httpx.get(f"http://{config.metrics.address}/status", timeout=STATUS_TIMEOUT_S)
        pid = r.json().get("upgrade", {}).get("pid")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None


def _candidate(args: argparse.Namespace, config: Config) -> str | None:
    python: str | None = args.to or config.engine.candidate.python
    return python


def _report(plan: UpgradePlan, as_json: bool) -> None:
    if as_json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print("\n".join(plan_text(plan)))


def main(args: argparse.Namespace) -> int:
    written = load_or_report(args.config)
    if written is None:
        return int(ExitCode.CONFIG)
    python = _candidate(args, written)
    if not python:
        print("error: no candidate release named\n  fix: give --to /opt/sglang-NEW/bin/python "
              "(a second venv with the new SGLang) or set engine.candidate.python", file=sys.stderr)
        return int(ExitCode.USAGE)
    if not os.access(python, os.X_OK):
        print(f"error: the candidate interpreter {python} does not exist or is not executable\n"
              "  fix: install the candidate into a venv of its own, e.g. python3 -m venv "
              "/opt/sglang-NEW && /opt/sglang-NEW/bin/pip install sglang==NEW", file=sys.stderr)
        return int(ExitCode.CONFIG)
    try:
        config = startup_config(written)
        plan = check_candidate(written, detect_engine_version(config), python)
    except ConfigError as exc:
        print(ConfigError(exc.problems, args.config).report(), file=sys.stderr)
        return int(ExitCode.CONFIG)
    _report(plan, args.json)
    if plan.blocked:
        return int(ExitCode.CONFIG)
    if not (args.now or args.retry):
        return int(ExitCode.OK)
    try:
        path = write_request(written, python, retry=args.retry)
    except OSError as exc:
        print(f"error: cannot write the request into {written.state_dir}: {exc.strerror}\n"
              "  fix: run as root or as the service user (sudo -u sglang ...)", file=sys.stderr)
        return int(ExitCode.FAILURE)
    pid = _daemon_pid(written)
    if pid is None:
        print(f"the candidate is named in {path}; the daemon takes it at its next reload: run "
              f"sudo systemctl reload sglang-{written.name}")
        return int(ExitCode.OK)
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"the candidate is named in {path}, but SIGHUP to the daemon (pid {pid}) failed: "
              f"{exc.strerror}; run sudo systemctl reload sglang-{written.name}")
        return int(ExitCode.OK)
    print(f"the daemon (pid {pid}) reloads with the candidate: watch /status (\"upgrade\") or the "
          "journal (EVENT=upgrade.verdict)")
    return int(ExitCode.OK)
