"""doctor's engine side: each profile rendered for the SGLang at hand, checked against our flag
catalogue, its renamed flags, the real SGLang parser (`engine/argcheck.py` run in the engine's
interpreter, once per distinct engine environment) and every audit rule."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from sglang_supervisor.commands.doctorreport import Report
from sglang_supervisor.core import audit, profiles
from sglang_supervisor.core.audit import Finding, HostFacts, ProfileView
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import Config, effective_overlay
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.modelinfo import ModelInfo
from sglang_supervisor.engine.realparser import ARGCHECK_SCRIPT, ARGCHECK_TIMEOUT_S, run_argcheck
from sglang_supervisor.engine.sglang import ENCODER_BOOTSTRAP_PORT_DEFAULT, flag_catalog

__all__ = ["ARGCHECK_SCRIPT", "ARGCHECK_TIMEOUT_S", "profile_findings", "run_argcheck", "written_args"]


def written_args(config: Config, name: str) -> list[str]:
    args, _ = effective_overlay(config, name)
    engine = config.engine
    out = ["--model-path", engine.model_path, "--host", engine.host, "--port", str(engine.port)]
    for flag, value in args.items():
        out += profiles.flag_tokens(flag, value)
    return out


def _real_parser_findings(
    by_env: Mapping[tuple[tuple[str, str], ...], list[ProfileView]],
    interpreter: str,
    runner: Callable[..., tuple[dict[str, Any] | None, str | None]],
    environ: Mapping[str, str],
    report: Report,
) -> str:
    """The real SGLang parser's verdict on every profile, run once per distinct engine environment;
    returns what doctor's JSON says of the parser ("sglang V via PYTHON", "unavailable: why")."""
    parser_state = "not run"
    ran: list[str] = []
    for overlay, group in by_env.items():
        env = engine_env(environ, dict(overlay))
        answer, why_not = runner(interpreter, {v.name: list(v.args) for v in group}, env=env)
        if answer is None:
            parser_state = f"unavailable: {why_not}"
            names = ", ".join(v.name for v in group)
            report.findings.append(
                Finding(
                    "warning",
                    "engine",
                    "the real SGLang argument parser could not be run"
                    + (f" for {names}" if len(by_env) > 1 else ""),
                    f"{why_not}; flags were checked against the supervisor's catalogue only",
                    f"install sglang into {interpreter}'s venv, or point engine.interpreter at it",
                    "parser.unavailable",
                )
            )
            continue
        ran.append(str(answer.get("version")))
        results = answer.get("results") or {}
        for v in group:
            report.findings += audit.parser_findings(v.name, results.get(v.name), answer.get("version"))
    if ran and not parser_state.startswith("unavailable"):
        parser_state = f"sglang {ran[0]} via {interpreter}"
    return parser_state


def profile_findings(
    config: Config,
    version: str,
    *,
    interpreter: str,
    real_parser: bool,
    report: Report,
    runner: Callable[..., tuple[dict[str, Any] | None, str | None]],
    model: ModelInfo | None,
    host: HostFacts,
    environ: Mapping[str, str],
) -> None:
    base_len = len(profiles.base_command(config, sys.executable))
    views: list[ProfileView] = []
    rendered_json: list[dict[str, object]] = []
    catalog = flag_catalog(version)
    # Profiles by the environment their engine gets: the parser runs once per distinct one.
    by_env: dict[tuple[tuple[str, str], ...], list[ProfileView]] = {}
    for p in config.profiles:
        rc = profiles.render(config, p.name, version, api_key=profiles.REDACTED,
                             secret_config_path=profiles.default_secret_config_path(config, os.environ))
        _, written_env = effective_overlay(config, p.name)
        sglang_args = tuple(rc.argv[base_len:])
        view = ProfileView(p.name, sglang_args, written_env, tuple(written_args(config, p.name)))
        views.append(view)
        by_env.setdefault(tuple(sorted(rc.env.items())), []).append(view)
        rendered_json.append(rc.to_json())
        report.findings += audit.migration_findings(p.name, version, rc.migrations)
        report.findings += audit.catalog_findings(p.name, version, rc.problems)
    parser_state = (_real_parser_findings(by_env, interpreter, runner, environ, report)
                    if real_parser else "not run")
    tp = max((parse_flags(v.args, catalog).int("--tp-size", 1) or 1) for v in views)
    for v in views:
        report.findings += audit.audit_profile(
            v, version, model, gpus=host.gpus, link=host.tp_link, catalog=catalog
        )
    report.engine.update({"parser": parser_state, "profiles": rendered_json, "tp_size": tp})


def encoder_ports(config: Config, version: str) -> dict[int, str]:
    catalog = flag_catalog(version)
    found: dict[int, str] = {}
    for p in config.profiles:
        flags = parse_flags(written_args(config, p.name), catalog)
        if flags.on("--language-only"):
            port = flags.int("--encoder-bootstrap-port", ENCODER_BOOTSTRAP_PORT_DEFAULT)
            if port:
                found[port] = f"encoder bootstrap (--language-only, profile {p.name})"
    return found
