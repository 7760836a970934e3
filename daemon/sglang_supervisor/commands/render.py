"""`sglang-supervisor render`: the SGLang command(s) a configuration would start, secrets redacted.

Besides the written profiles, the derived ones the state file remembers as having served
(core/derive.py, issue 25): `run` may start them first, so they are shown with their base, their
change and the failure line that asked for them; `--profile` takes their names too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.profiles import (
    REDACTED,
    RenderedCommand,
    config_problems,
    default_secret_config_path,
    detect_engine_version,
    render,
    shell_format,
    with_derived,
)
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.files.state import remembered_derived


def _derived_note(d: Derivation) -> str:
    return f"derived from {d.base}: {d.change}; remembered (it served); asked by: {d.asked_by}"


def _shell_block(rc: RenderedCommand, version: str, description: str) -> str:
    head = f"profile {rc.profile} (sglang {version})" + (f": {description}" if description else "")
    if "--nnodes" in rc.argv:  # say which node of the group this command is for
        i = rc.argv.index("--node-rank") if "--node-rank" in rc.argv else -1
        node = rc.argv[i + 1] if i >= 0 else "0"
        head += f" [node {node} of {rc.argv[rc.argv.index('--nnodes') + 1]}]"
    lines = [f"# {line}" for line in textwrap.wrap(head, width=98)]
    lines += [f"# migrated: {m.old} -> {m.new or '(dropped)'}  [since {m.since}: {m.note}]"
              for m in rc.migrations]
    lines += [f"# {p.severity}: {p.message}; fix: {p.fix}" for p in rc.problems]
    lines.append(shell_format(rc))
    return "\n".join(lines)


def for_node(config: Config, node_rank: int | None, source: str) -> Config:
    """The configuration as node `node_rank` of its group sees it (`--node-rank`)."""
    if node_rank is None:
        return config
    if config.group is None:
        raise ConfigError([ConfigProblem("--node-rank", "the configuration has no group: block",
                                         "drop --node-rank, or add group: (docs/CONFIG.md)")], source)
    if not 0 <= node_rank < config.group.nnodes:
        raise ConfigError([ConfigProblem("--node-rank", f"node rank {node_rank} is not in the group",
                                         f"use 0..{config.group.nnodes - 1}")], source)
    group = config.group.model_copy(update={"node_rank": node_rank})
    return config.model_copy(update={"group": group})


def main(args: argparse.Namespace) -> int:
    try:
        config = for_node(load_config(args.config), getattr(args, "node_rank", None), args.config)
        # A group never derives (its workers start only written profiles): nothing remembered.
        derived = ({} if config.group is not None else
                   remembered_derived(config.state_dir, config.name, config.profile_names))
        if args.profile is not None and args.profile not in (*config.profile_names, *derived):
            raise ConfigError([ConfigProblem("--profile", f"no profile is named {args.profile!r}",
                                             f"use one of: {', '.join([*config.profile_names, *derived])}")],
                              args.config)
        version = args.sglang_version or detect_engine_version(config)
        names = [args.profile] if args.profile is not None else [*config.profile_names, *derived]
        # Display only: the key is never read here, the --config file path is shown instead.
        secret_path = default_secret_config_path(config, os.environ)
        rendered = [render(with_derived(config, derived[name]) if name in derived else config, name,
                           version, api_key=REDACTED, secret_config_path=secret_path)
                    for name in names]
    except ConfigError as exc:
        print(ConfigError(exc.problems, args.config).report(), file=sys.stderr)
        return ExitCode.CONFIG
    if args.format == "json":
        docs = [{**rc.to_json(), "sglang_version": version,
                 **({"derived": derived[rc.profile].to_json()} if rc.profile in derived else {})}
                for rc in rendered]
        print(json.dumps(docs[0] if args.profile is not None else docs, indent=2))
    else:
        print("\n\n".join(_shell_block(rc, version, _derived_note(derived[rc.profile])
                                        if rc.profile in derived else config.profile(rc.profile).description)
                          for rc in rendered))
    errors = [p for rc in rendered for p in config_problems(
        with_derived(config, derived[rc.profile]) if rc.profile in derived else config, rc, version)]
    if errors:
        print(ConfigError(errors, args.config).report(), file=sys.stderr)
        return ExitCode.CONFIG
    return ExitCode.OK
