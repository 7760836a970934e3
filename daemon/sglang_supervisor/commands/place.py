"""`sglang-supervisor place NAME --from FILE`: FILE's configuration for model NAME, with an engine
port, metrics address and engine log file that no other model on the host claims (what
`sglang-model add` writes to /etc/sglang-supervisor/NAME.yaml).

The new text goes to stdout, one line per value it changed to stderr. A source that does not
validate is copied with only its name changed (a note says so): it is the operator's to finish.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from pathlib import Path

from sglang_supervisor.commands.hostmodels import other_models
from sglang_supervisor.core.address import parse_address
from sglang_supervisor.core.config import MAX_CONFIG_BYTES, ConfigError
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.hostclash import claimed_ports, claims_of, clashes, free_port, hosts_overlap
from sglang_supervisor.core.modelcopy import retarget
from sglang_supervisor.shell.files.configfile import parse_checked


def _port_taken(port: int, host: str, others: list[tuple[str, int]]) -> bool:
    return any(p == port and hosts_overlap(host, h) for h, p in others)


def main(args: argparse.Namespace) -> int:
    source = Path(args.from_file)
    try:
        with source.open("rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1).decode("utf-8", errors="replace")
    except OSError as exc:
        print(f"sglang-supervisor place: cannot read {source}: {exc.strerror} (pass an existing file "
              "with --from)", file=sys.stderr)
        return ExitCode.USAGE
    directory = Path(args.config_dir)
    try:
        config = parse_checked(text, str(source))
    except ConfigError as exc:
        print(f"note: {source} does not validate ({exc.problems[0].problem if exc.problems else 'invalid'}): "
              "copied with only its name changed; set engine.port, metrics.address and engine.log_file "
              "by hand", file=sys.stderr)
        sys.stdout.write(retarget(text, args.name, {}))
        return ExitCode.OK
    others, notes = other_models(directory, exclude=directory / f"{args.name}.yaml")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    listeners = [(e.host, e.port) for c in others for e in c.endpoints]
    taken = claimed_ports(others)
    values: dict[tuple[str, str], str] = {}
    changes: list[str] = []
    engine_port = config.engine.port
    if _port_taken(engine_port, config.engine.host, listeners):
        engine_port = free_port(engine_port + 1, taken) or engine_port
        values[("engine", "port")] = str(engine_port)
        changes.append(f"engine.port: {engine_port} (was {config.engine.port}, claimed by another model)")
    taken.add(engine_port)
    if config.metrics.enabled:
        host, port = parse_address(config.metrics.address)
        if port != 0 and (port == engine_port or _port_taken(port, host, listeners)):
            new = free_port(port + 1, taken) or port
            shown = f"[{host}]" if ":" in host else host
            values[("metrics", "address")] = f'"{shown}:{new}"'
            changes.append(f"metrics.address: {shown}:{new} (was {config.metrics.address}, "
                           "claimed by another model)")
    mine = claims_of(config, str(source)).log_file
    log_file = posixpath.join(posixpath.dirname(mine), f"{args.name}-engine.log")
    if log_file != mine:
        values[("engine", "log_file")] = log_file
        changes.append(f"engine.log_file: {log_file} (this model's own)")
    new_text = retarget(text, args.name, values)
    sys.stdout.write(new_text)
    for change in changes:
        print(f"set {change}", file=sys.stderr)
    # What cannot be picked here (the GPUs: how many the host has is not this file's to know).
    copy = parse_checked(new_text, str(directory / f"{args.name}.yaml"))
    for problem in clashes(claims_of(copy, str(directory / f"{args.name}.yaml")), others):
        print(f"still to fix: {problem.path}: {problem.problem}\n    fix: {problem.fix}", file=sys.stderr)
    return ExitCode.OK
