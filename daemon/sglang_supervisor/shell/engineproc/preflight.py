"""Preflight: a configuration validated and rendered for one engine version, and the facts the
lifecycle and the engine runner read off a rendered command (tensor parallel size, the captures
to wait for, the decode log interval). Pure but for reading the API key files and the group's link secret.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_supervisor.core.config import Config, ConfigError, ConfigProblem, effective_overlay
from sglang_supervisor.core.derive import Derivation
from sglang_supervisor.core.inputs import Settings
from sglang_supervisor.core.liveness import failure_grace_s
from sglang_supervisor.core.profiles import (
    RenderedCommand,
    config_problems,
    default_secret_config_path,
    render,
)
from sglang_supervisor.core.readiness import CaptureKey
from sglang_supervisor.engine.argv import options_set, tp_size
from sglang_supervisor.engine.graphs import expected_captures
from sglang_supervisor.shell.engineproc import ports
from sglang_supervisor.shell.engineproc.apikey import read_api_key
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.links.fleet import read_gateway_key
from sglang_supervisor.shell.links.groupsecret import read_group_secret


@dataclass(frozen=True)
class Prepared:
    """A validated configuration, rendered for one engine version."""

    config: Config
    version: str
    renders: Mapping[str, RenderedCommand]
    api_key: str | None
    gateway_key: str | None = None  # gateway.api_key_file's key, when a gateway is configured
    group_secret: bytes | None = None  # a multi-node group's link secret (shell/links/groupsecret.py)


def capture_keys(argv: Sequence[str], version: str) -> frozenset[CaptureKey]:
    keys: set[CaptureKey] = set()
    for cap in expected_captures(argv, version, tp_size(argv)):
        for rank in cap.ranks:
            keys.add((cap.owner, cap.phase, rank))
    return frozenset(keys)


def prepare(config: Config, version: str, *, secret_path: str | None = None) -> Prepared:
    """Render every profile; any flag the target release refuses is a configuration error."""
    api_key = read_api_key(config.engine)
    path = secret_path or default_secret_config_path(config, os.environ)
    renders: dict[str, RenderedCommand] = {}
    problems: list[ConfigProblem] = []
    for p in config.profiles:
        rc = render(config, p.name, version, python=sys.executable, secret_config_path=path,
                    api_key=api_key)
        renders[p.name] = rc
        problems += config_problems(config, rc, version)
    if problems:
        raise ConfigError(problems, f"rendering for SGLang {version}")
    secret = read_group_secret(config.group) if config.group is not None else None
    return Prepared(config, version, renders, api_key, gateway_key(config), secret)


def gateway_key(config: Config) -> str | None:
    """gateway.api_key_file's key; a file we cannot use is a configuration error."""
    if not config.gateway.enabled:
        return None
    try:
        return read_gateway_key(config.gateway.api_key_file)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigError([ConfigProblem("gateway.api_key_file", f"cannot use the gateway key: {why}",
                                         "write the gateway's API key, one line, into a file "
                                         "readable by the service user")], "gateway") from None


def ladder_hash(renders: Mapping[str, RenderedCommand]) -> str:
    joined = [(name, rc.argv, sorted(rc.env.items())) for name, rc in sorted(renders.items())]
    return state.command_hash([repr(joined)])


def with_remembered(names: Sequence[str], derived: Mapping[str, Derivation]) -> tuple[str, ...]:
    """The ladder with each remembered derived profile right after its written base (a base no
    longer configured takes its derived profiles with it)."""
    out: list[str] = []
    for name in names:
        out.append(name)
        out += [n for n, d in derived.items() if d.base == name and n not in names]
    return tuple(out)


def policy_settings(config: Config, *, last_good: str | None, known_bad: Mapping[str, str],
                    retry_known_bad: bool, probation: str | None = None,
                    renders: Mapping[str, RenderedCommand] | None = None,
                    derived: Mapping[str, Derivation] | None = None) -> Settings:
    t = config.timeouts
    # A multi-node group's workers render only the written profiles (grouplink: an unknown name
    # is refused), so a group leader never derives: the ladder is what every node can start.
    grouped = config.group is not None
    remembered = {n: d for n, d in (derived or {}).items()
                  if d.base in config.profile_names and not grouped}
    return Settings(
        profiles=with_remembered(config.profile_names, remembered),
        derived=remembered,
        remediation=dict(config.remediation),
        last_good=last_good,
        known_bad=dict(known_bad),
        retry_known_bad=retry_known_bad,
        probation=probation,
        same_profile_retries=config.restart.same_profile_retries,
        health_failures=t.health_failures,
        stall_s=t.stall_s,
        start_s=t.start_s,
        backoff_s=config.restart.backoff_s,
        failure_grace_s=failure_grace_s(t.stall_s),
        temporary_wait_s=config.restart.temporary_wait_s,
        profile_flags={name: options_set(r.argv) for name, r in (renders or {}).items()},
        profile_args={name: effective_overlay(config, name)[0] for name in config.profile_names},
        derive_on=frozenset() if grouped else frozenset(config.restart.derive),
        derived_steps=config.restart.derived_steps,
    )


def port_taken(host: str, port: int) -> str | None:
    """Why the engine could not bind host:port now, or None when it could."""
    why = ports.bind_error(host, port)
    if why is None:
        return None
    return f"{host}:{port} is already in use ({why}); stop what listens there or set engine.port " \
           "to a free port"


def gpu_indices(env: Mapping[str, str]) -> set[int] | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return {int(p) for p in parts} if parts and all(p.isdigit() for p in parts) else None
