"""`sglang-supervisor run`: the daemon systemd starts.

Preflight (configuration, engine version, every profile rendered for that version) happens before
anything is launched: a problem there is a configuration error (exit 78), reported with the key
path, the problem and the fix, and systemd does not restart us (RestartPreventExitStatus=78).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import structlog

from sglang_supervisor.commands.hostmodels import host_problems
from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.group import NODE_RANK_ENV, with_node_rank
from sglang_supervisor.engine.argv import tp_size
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell.files.configfile import load_config, logging_config_problems
from sglang_supervisor.shell.links.grouplink import WorkerNode
from sglang_supervisor.shell.supervisor import Options, Prepared, Supervisor, capture_keys, prepare
from sglang_supervisor.shell.telemetry.logsetup import LogFormat, configure_logging, shutdown_logging
from sglang_supervisor.shell.upgrades import startup_config

log = structlog.get_logger("sglang_supervisor")


def load_and_prepare(path: str, log_format: LogFormat | None) -> Prepared:
    """Load, set up logging as configured, detect the version and render: ConfigError on problems."""
    warnings: list[ConfigProblem] = []
    config: Config = load_config(path, on_warning=warnings.append)
    if config.group is not None:  # SGLANG_SUPERVISOR_NODE_RANK: one configuration for every node
        try:
            config = config.model_copy(update={"group": with_node_rank(config.group, os.environ)})
        except ValueError as exc:
            raise ConfigError([ConfigProblem("group.node_rank", str(exc).splitlines()[0],
                                             f"fix {NODE_RANK_ENV}")], path) from None
    if log_format is None and config.logging.format != "auto":
        configure_logging(config.logging.format, background=True)
    for w in warnings:
        log.warning("config.warning", path=w.path or path, problem=w.problem, fix=w.fix)
    # `check` refuses a clash with another model of this host; `run` names each one at once (the
    # other model may be stopped for good) rather than wait start_s on port_in_use without a word.
    clashes, _ = host_problems(config, path)
    for c in clashes:
        log.warning("host.clash", path=path, key=c.path, problem=c.problem, fix=c.fix)
    config = startup_config(config)  # a candidate the upgrade canary promoted keeps serving
    prepared = prepare(config, detect_engine_version(config))
    # check only warns about SGLANG_LOGGING_CONFIG_PATH; run reads the file it will start with
    errors, more = logging_config_problems(
        {name: r.env for name, r in prepared.renders.items()}, os.environ)
    if errors:
        raise ConfigError(errors, path)
    for w in more:
        log.warning("config.warning", path=w.path or path, problem=w.problem, fix=w.fix)
    return prepared


def report_config_error(exc: ConfigError, path: str) -> int:
    report = ConfigError(exc.problems, path).report()
    log.error("config.invalid", config=path, problems=len(exc.problems), report=report)
    print(report, file=sys.stderr)
    return int(ExitCode.CONFIG)


async def run_worker_node(prepared: Prepared) -> int:
    """Node R > 0 of a multi-node group: follow the leader (grouplink.WorkerNode)."""
    version = prepared.version
    assert prepared.group_secret is not None  # preflight reads it for every group
    node = WorkerNode(prepared.config, version, renders=dict(prepared.renders),
                      api_key=prepared.api_key, secret=prepared.group_secret, environ=dict(os.environ),
                      capture_keys=lambda argv: capture_keys(argv, version), tp_size=tp_size)
    return await node.run()


def main(args: argparse.Namespace) -> int:
    fmt: LogFormat | None = args.log_format
    configure_logging(fmt or "auto", background=True)
    try:
        try:
            prepared = load_and_prepare(args.config, fmt)
        except ConfigError as exc:
            return report_config_error(exc, args.config)
        group = prepared.config.group
        if group is not None and not group.leader:
            return asyncio.run(run_worker_node(prepared))
        options = Options(config_path=args.config, retry_known_bad=args.retry_known_bad)
        return asyncio.run(Supervisor(prepared, options).run())
    finally:
        shutdown_logging()
