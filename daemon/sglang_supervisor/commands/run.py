"""`sglang-supervisor run`: the daemon systemd starts.

Preflight (configuration, engine version, every profile rendered for that version) happens before
anything is launched: a problem there is a configuration error (exit 78), reported with the key
path, the problem and the fix, and systemd does not restart us (RestartPreventExitStatus=78).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import structlog

from sglang_supervisor.config import Config, ConfigError, ConfigProblem, load_config
from sglang_supervisor.engineinfo import detect_engine_version
from sglang_supervisor.exitcodes import ExitCode
from sglang_supervisor.logsetup import LogFormat, configure_logging, shutdown_logging
from sglang_supervisor.supervisor import Options, Prepared, Supervisor, prepare

log = structlog.get_logger("sglang_supervisor")


def load_and_prepare(path: str, log_format: LogFormat | None) -> Prepared:
    """Load, set up logging as configured, detect the version and render: ConfigError on problems."""
    warnings: list[ConfigProblem] = []
    config: Config = load_config(path, on_warning=warnings.append)
    if log_format is None and config.logging.format != "auto":
        configure_logging(config.logging.format, background=True)
    for w in warnings:
        log.warning("config.warning", path=w.path or path, problem=w.problem, fix=w.fix)
    return prepare(config, detect_engine_version(config))


def report_config_error(exc: ConfigError, path: str) -> int:
    report = ConfigError(exc.problems, path).report()
    log.error("config.invalid", config=path, problems=len(exc.problems), report=report)
    print(report, file=sys.stderr)
    return int(ExitCode.CONFIG)


def main(args: argparse.Namespace) -> int:
    fmt: LogFormat | None = args.log_format
    configure_logging(fmt or "auto", background=True)
    try:
        try:
            prepared = load_and_prepare(args.config, fmt)
        except ConfigError as exc:
            return report_config_error(exc, args.config)
        options = Options(config_path=args.config, retry_known_bad=args.retry_known_bad)
        return asyncio.run(Supervisor(prepared, options).run())
    finally:
        shutdown_logging()
