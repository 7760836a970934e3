"""`sglang-supervisor check`: validate a configuration and every profile's rendered command.

Exit 0 with a short summary, or 78 with a report that names each key path, problem and fix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.profiles import (
    REDACTED,
    RenderedCommand,
    config_problems,
    default_secret_config_path,
    detect_engine_version,
    render,
)
from sglang_supervisor.shell.engineproc.apikey import read_api_key
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.links.groupsecret import read_group_secret


def _problem_json(p: ConfigProblem) -> dict[str, str]:
    return {"path": p.path, "problem": p.problem, "fix": p.fix}


def _summary(path: str, config: Config, version: str, source: str, rendered: list[RenderedCommand]) -> str:
    lines = [f"OK {path}: {len(config.profiles)} profiles, sglang {version} ({source})"]
    for rc in rendered:
        notes = []
        if rc.migrations:
            notes.append(f"{len(rc.migrations)} migration{'s' if len(rc.migrations) != 1 else ''}")
        if rc.warnings:
            notes.append(f"{len(rc.warnings)} warning{'s' if len(rc.warnings) != 1 else ''}")
        lines.append(f"  {rc.profile}: {', '.join(notes) or 'renders as written'}")
        lines += [f"    migrated: {m.old} -> {m.new or '(dropped)'}  [since {m.since}]"
                  for m in rc.migrations]
        lines += [f"    warning: {w.message}; {w.fix}" for w in rc.warnings]
    return "\n".join(lines)


def _secret_problems(config: Config) -> list[ConfigProblem]:
    """What `run` would say reading the secrets' files at start (content, mode, owner)."""
    problems: list[ConfigProblem] = []
    if config.engine.api_key_file is not None:
        # The key's own content (e.g. too short to redact): `run` reads it the same way.
        try:
            read_api_key(config.engine)
        except ConfigError as exc:
            problems += exc.problems
    if config.group is not None and config.group.secret_file is not None:
        # Mode, owner and content of the link's secret: `run` reads it the same way.
        try:
            read_group_secret(config.group)
        except ConfigError as exc:
            problems += exc.problems
    if not problems and config.gateway.api_key_file is not None:
        # The daemon's module doubles check's start-up time: load it only when needed.
        from sglang_supervisor.shell.supervisor import gateway_key  # noqa: PLC0415

        try:
            gateway_key(config)  # `run` reads it at start the same way
        except ConfigError as exc:
            problems += exc.problems
    return problems


def _host_clashes(config: Config, path: str, warnings: list[ConfigProblem]) -> list[ConfigProblem]:
    """Other models on the host: refuse a configuration whose start would wait 20 minutes on
    port_in_use or share a log, state file or GPUs (core/hostclash.py)."""
    from sglang_supervisor.commands.hostmodels import host_problems  # noqa: PLC0415

    clashes, notes = host_problems(config, path)
    warnings += [ConfigProblem("", note, "check that file on its own") for note in notes]
    return clashes


def main(args: argparse.Namespace) -> int:
    warnings: list[ConfigProblem] = []
    rendered: list[RenderedCommand] = []
    version = ""
    try:
        config = load_config(args.config, on_warning=warnings.append)
        if args.sglang_version:
            version, source = args.sglang_version, "given with --sglang-version"
        else:
            version = detect_engine_version(config)
            source = "configured" if config.engine.version != "auto" else "asked the engine"
        problems: list[ConfigProblem] = []
        for profile in config.profile_names:
            rc = render(config, profile, version, api_key=REDACTED,
                        secret_config_path=default_secret_config_path(config, os.environ))
            rendered.append(rc)
            problems += config_problems(config, rc, version)
        if not problems:
            problems += _secret_problems(config)
        if not args.alone:
            problems += _host_clashes(config, args.config, warnings)
        if problems:
            raise ConfigError(problems, args.config)
    except ConfigError as exc:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        # Report under the file's name, whichever step (load, version, render) found the problem.
        print(ConfigError(exc.problems, args.config).report(), file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "config": args.config, "sglang_version": version or None,
                              "problems": [_problem_json(p) for p in exc.problems],
                              "warnings": [_problem_json(w) for w in warnings]}))
        return ExitCode.CONFIG
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps({
            "ok": True, "config": args.config, "sglang_version": version,
            "profiles": [{"name": rc.profile,
                          "migrations": rc.to_json()["migrations"],
                          "warnings": [{"flag": w.flag, "message": w.message, "fix": w.fix}
                                       for w in rc.warnings]}
                         for rc in rendered],
            "warnings": [_problem_json(w) for w in warnings],
        }))
    else:
        print(_summary(args.config, config, version, source, rendered))
    return ExitCode.OK
