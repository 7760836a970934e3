"""One e2e run as every scenario sees it: the options, the budget, the report it records into,
the configuration of a supervised run, and a hand launch of the same argv."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from .adapters import Nvml, free_port, probe_series, reap
from .common import READY_LINE, SGLANG_VERSION, build_config, render_markdown, scenario_status


class Context:
    """What the scenarios share of one run (the old E2E class less its scenarios)."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self.o = opts
        self.out = Path(opts.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(opts.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.t_start = time.time()
        self.deadline = self.t_start + opts.budget_s
        self.real = opts.engine == "real"
        self.nvml = Nvml()
        self.report: dict[str, Any] = {
            "engine": opts.engine, "tp": opts.tp,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "environment": self._environment(), "scenarios": {},
        }
        self.baseline_mem = self.nvml.used(opts.tp)
        self.report["environment"]["gpu_memory_used_baseline_bytes"] = self.baseline_mem
        # Set by scenario main: its restarted engine's probes (s4), and the configuration the
        # hand launches of scenario pipe repeat.
        self.after_restart: dict[str, Any] | None = None
        self.hand_cfg: dict[str, Any] | None = None

    def left(self) -> float:
        return self.deadline - time.time()

    def _environment(self) -> dict[str, Any]:
        env: dict[str, Any] = {"python": sys.version.split()[0]}
        if self.real:
            from importlib.metadata import PackageNotFoundError, version
            for pkg in ("sglang", "torch", "transformers", "sglang-kernel"):
                with contextlib.suppress(PackageNotFoundError):
                    env[pkg.replace("-", "_") + ("_version" if pkg == "sglang" else "")] = version(pkg)
        else:
            env["sglang_version"] = f"simulator emulating {SGLANG_VERSION}"
        env.update(self.nvml.describe())
        return env

    def config(self, name: str, **kw: Any) -> dict[str, Any]:
        return build_config(engine=self.o.engine, python=self.o.engine_python, model=self.o.model,
                            port=free_port(), metrics_port=free_port(), workdir=self.work / name,
                            tp=self.o.tp, time_scale=self.o.time_scale, **kw)

    def record(self, name: str, checks: list[dict[str, Any]], numbers: dict[str, Any] | None = None,
               note: str = "") -> None:
        self.report["scenarios"][name] = {"status": scenario_status(checks), "checks": checks,
                                          "numbers": numbers or {}, "note": note}
        self.save()

    def skip(self, name: str, note: str) -> None:
        self.report["scenarios"][name] = {"status": "not run", "checks": [], "numbers": {}, "note": note}
        self.save()

    def save(self) -> None:
        self.report["wall_s"] = round(time.time() - self.t_start, 1)
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str))
        (self.out / "report.md").write_text(render_markdown(self.report))

    # -- scenario 1, 2 (supervised half), 5, 4 on one supervised engine -------------------------

    def hand_launch(self, cfg: dict[str, Any], pipe: bool = False, profile: str = "graphs",
                    log_name: str | None = None, runs: int | None = None) -> dict[str, Any]:
        """The same argv and environment the supervisor renders, started by hand."""
        from sglang_supervisor.core.profiles import default_secret_config_path, render
        from sglang_supervisor.shell.engineproc.apikey import read_api_key
        from sglang_supervisor.shell.files.configfile import parse_checked
        cfg = json.loads(json.dumps(cfg))
        port = free_port()
        cfg["engine"]["port"] = port
        config = parse_checked(yaml.safe_dump(cfg), "hand.yaml")
        rc = render(config, profile, SGLANG_VERSION, python=self.o.python, api_key=read_api_key(config.engine),
                    secret_config_path=default_secret_config_path(config, os.environ))
        env = dict(os.environ, **rc.env)
        env.pop("NOTIFY_SOCKET", None)
        log_path = self.work / (log_name or ("hand-pipe-engine.log" if pipe else "hand-engine.log"))
        t0 = time.time()
        logf = log_path.open("wb")
        p = subprocess.Popen(rc.argv, stdout=subprocess.PIPE if pipe else logf, stderr=subprocess.STDOUT,
                             env=env, start_new_session=True)
        if pipe:
            def drain() -> None:
                assert p.stdout is not None
                while chunk := p.stdout.read1(65536):
                    logf.write(chunk)
                    logf.flush()
            threading.Thread(target=drain, daemon=True).start()
        res: dict[str, Any] = {"argv_tail": rc.argv[3:], "stdout": "pipe" if pipe else "file"}
        try:
            while time.time() < self.deadline - 60 and p.poll() is None:
                if READY_LINE.encode() in log_path.read_bytes():
                    res["ready_after_s"] = round(time.time() - t0, 1)
                    break
                time.sleep(0.2)
            if "ready_after_s" in res:
                res["probe_series"] = probe_series(f"http://127.0.0.1:{port}", runs or self.o.probe_runs,
                                                   self.nvml.sm_clock_mhz)
            else:
                res["error"] = f"not ready (rc {p.poll()})"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            reap(p, 30)
            time.sleep(1)
        return res
