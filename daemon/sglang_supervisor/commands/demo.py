"""`sglang-supervisor demo`: the supervisor on the packaged demo.yaml, driving the SGLang simulator.

Everything it writes (state, engine log, the engine's secret config) goes to a temporary
directory that is removed at exit; the engine and the metrics endpoint listen on loopback. A
`--fault` is injected into the FIRST profile's engine only (through that profile's environment),
so the demo shows the fallback ladder at work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog
import yaml

from sglang_supervisor.core.config import ConfigError
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell.files.configfile import default_demo_config_path, parse_checked
from sglang_supervisor.shell.supervisor import Options, Supervisor, prepare
from sglang_supervisor.shell.telemetry.logsetup import configure_logging, shutdown_logging
from sglang_supervisor.simulator.faults import FaultSpecError, parse_fault

log = structlog.get_logger("sglang_supervisor")

DEFAULT_TIME_SCALE = 0.05
DEFAULT_METRICS = ("127.0.0.1", 9400)
FAULTS_ENV = "SGLANG_SIM_FAULTS"
TIME_SCALE_ENV = "SGLANG_SIM_TIME_SCALE"
# Engine lines at warning priority or worse reach the terminal; the rest stays in the engine log.
DEMO_FORWARD_PRIORITY = 4


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def demo_config_data(base: dict[str, Any], workdir: Path, *, engine_port: int, time_scale: float,
                     faults: list[str]) -> dict[str, Any]:
    """The packaged demo.yaml with the per-run overrides applied (pure)."""
    data: dict[str, Any] = json.loads(json.dumps(base))  # deep copy of plain YAML data
    engine = data["engine"]
    engine["port"] = engine_port
    engine["log_file"] = str(workdir / "engine.log")
    engine.setdefault("env", {})[TIME_SCALE_ENV] = f"{time_scale:g}"
    data["state_dir"] = str(workdir / "state")
    data["runtime_dir"] = str(workdir / "run")
    if faults:
        first = data["profiles"][0]
        env = first.setdefault("env", {})
        env[FAULTS_ENV] = ",".join(faults)
    return data


def _summary(sup: Supervisor) -> dict[str, Any]:
    snap = sup.lifecycle.snapshot(0.0)
    return {
        "ready": sup.lifecycle.ready_sent,
        "profile": sup.lifecycle.profile or "",
        "attempts": [{"profile": a["profile"], "outcome": a["outcome"],
                      "failure_class": a["failure_class"],
                      "seconds": round(float(a["seconds"]), 2)} for a in snap["attempts"]],
    }


def main(args: argparse.Namespace) -> int:
    configure_logging("console", background=True)
    workdir = Path(tempfile.mkdtemp(prefix="sglang-supervisor-demo-"))
    sup: Supervisor | None = None
    code = int(ExitCode.FAILURE)
    try:
        for spec in args.fault:
            try:
                parse_fault(spec)
            except FaultSpecError as exc:
                print(f"demo: --fault {spec}: {exc}", file=sys.stderr)
                return int(ExitCode.USAGE)
        scale = args.time_scale
        if scale is None:
            scale = float(os.environ.get(TIME_SCALE_ENV, DEFAULT_TIME_SCALE))
        if args.metrics_address:
            metrics_address = args.metrics_address
        else:
            host, port = DEFAULT_METRICS
            metrics_address = f"{host}:{port if port_free(host, port) else free_port(host)}"
        base = yaml.safe_load(default_demo_config_path().read_text())
        data = demo_config_data(base, workdir, engine_port=args.engine_port or free_port(),
                                time_scale=scale, faults=list(args.fault))
        config_path = workdir / "demo.yaml"
        config_path.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            config = parse_checked(config_path.read_text(), str(config_path))
            prepared = prepare(config, detect_engine_version(config))
        except ConfigError as exc:
            print(exc.report(), file=sys.stderr)
            return int(ExitCode.CONFIG)
        log.info("demo.start", engine=f"{config.engine.host}:{config.engine.port}",
                 time_scale=scale, faults=",".join(args.fault) or None, workdir=str(workdir))
        options = Options(
            config_path=str(config_path), exit_after_ready=args.exit_after_ready,
            forward_max_priority=DEMO_FORWARD_PRIORITY, metrics_address=metrics_address,
            on_metrics_url=lambda url: log.info("demo.metrics", url=url + "/metrics",
                                                status=url + "/status"))
        sup = Supervisor(prepared, options)
        code = asyncio.run(sup.run())
        return code
    finally:
        shutdown_logging()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
        if args.json_summary:
            summary = _summary(sup) if sup is not None else {"ready": False, "profile": "",
                                                             "attempts": []}
            print(json.dumps(summary), flush=True)
