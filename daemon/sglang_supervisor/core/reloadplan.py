"""What a reload (SIGHUP) can change while the supervisor runs. Pure: two configurations in, the
keys a reload could not apply out.

A reload applies every changed key or is refused with a reason: never half-applied while
`/status` shows values that are not in effect. Most keys apply at once (profiles, remediation,
timeouts, restart, probe: the running throughput monitor is replaced). These cannot:

- fixed for the supervisor's whole run (bound or opened at start): `name`, `state_dir`,
  `runtime_dir`, `metrics.*`, `logging.format`, `gateway.*`;
- fixed for the running engine (its log pipe was set up when it started): `engine.log_file`,
  `engine.log_max_bytes`, `engine.log_backups`, `logging.forward_engine_output`. They apply when
  the same reload restarts the engine anyway (its command changed), else the reload is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_supervisor.core.config import Config

FIXED_FOR_THE_RUN: Mapping[str, str] = {
    "name": "it names the state file, the metrics labels and the secret file",
    "state_dir": "the state file was opened at start",
    "runtime_dir": "the running engine's secret --config file is there",
    "metrics": "the metrics endpoint was bound at start",
    "logging.format": "the supervisor's log output was set up at start",
    "gateway": "the gateway agent (registration, drain) was set up at start",
    "group": "this node's role and the group link were set up at start (restart the group's supervisors)",
}
FIXED_FOR_THE_ENGINE: Mapping[str, str] = {
    "engine.log_file": "the running engine writes there",
    "engine.log_max_bytes": "the running engine's log was opened with it",
    "engine.log_backups": "the running engine's log was opened with it",
    "logging.forward_engine_output": "the running engine's log pump was set up with it",
}


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and not prefix.endswith((".args", ".env")):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_leaves(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_keys(old: Config, new: Config) -> list[str]:
    """Key paths whose value differs (mappings of flags and environment count as one value)."""
    a, b = _leaves(old.model_dump()), _leaves(new.model_dump())
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def refused_keys(old: Config, new: Config, *, engine_restarts: bool) -> dict[str, str]:
    """Changed keys this reload cannot apply -> why. Empty: the reload applies everything."""
    out: dict[str, str] = {}
    for key in changed_keys(old, new):
        for prefix, why in FIXED_FOR_THE_RUN.items():
            if _under(key, prefix):
                out[key] = why
        if not engine_restarts:
            for prefix, why in FIXED_FOR_THE_ENGINE.items():
                if _under(key, prefix):
                    out[key] = why
    return out


def refusal_reason(refused: Mapping[str, str]) -> str:
    keys = ", ".join(sorted(refused))
    first = refused[sorted(refused)[0]]
    return (f"{keys} changed: a reload cannot apply {'it' if len(refused) == 1 else 'them'} "
            f"({first}); restart the unit to apply, or revert the change")
