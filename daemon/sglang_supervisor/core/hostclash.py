"""Models on one host that would step on each other: what each claims, and which claims clash.

A second model copied from the first keeps its port, metrics address and log file; nothing fails
until `systemctl start` waits 20 minutes on `port_in_use` or two engines interleave one log. `check`
compares a model's claims with every other configuration on the host
and names both models and the fix; `sglang-model add` picks values nobody claims (`free_port`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sglang_supervisor.core.address import AddressError, parse_address
from sglang_supervisor.core.config import ArgValue, Config, ConfigProblem, effective_overlay

# Addresses that listen on every interface of their family: they overlap any host.
_WILDCARDS = frozenset({"0.0.0.0", "::", "*", ""})
_LOOPBACK_NAMES = {"localhost": "127.0.0.1", "ip6-localhost": "::1"}
# The simulator (this package's `sglang-sim`) loads nothing onto a GPU: a simulated model may
# share GPUs with a real one (docs/OPERATIONS.md runs sim.yaml beside qwen.yaml).
_SIMULATOR_COMMANDS = frozenset({"sglang-sim"})
_SIMULATOR_MODULE = "sglang_supervisor.simulator"
_TP_KEYS = ("tp-size", "tensor-parallel-size", "tp")
_DP_KEYS = ("dp-size", "data-parallel-size")
_PP_KEYS = ("pp-size", "pipeline-parallel-size")
# `--mem-fraction-static`: two models on one GPU that together ask for at most all of its memory
# were meant to share it; anything else fails at start (KV cache OOM, or a foreign holder waited out).
_MEM_KEY = "mem-fraction-static"


@dataclass(frozen=True)
class Endpoint:
    what: str  # the key that claims it: "engine.port", "metrics.address"
    host: str
    port: int


@dataclass(frozen=True)
class ModelClaims:
    """What one configuration takes on the host. `gpus` are CUDA_VISIBLE_DEVICES entries (indices or
    UUIDs as written) or, without it, physical indices; None: the model uses no GPU."""

    name: str
    source: str  # the configuration file
    endpoints: tuple[Endpoint, ...]
    log_file: str
    state_file: str
    gateway_record: str | None  # the gateway id record in state_dir, when gateway.url is set
    gpus: frozenset[str] | None
    gpu_key: str  # where the GPUs come from, for the fix
    mem_fraction: float | None  # the largest explicit --mem-fraction-static of its profiles


def _int_arg(args: dict[str, ArgValue], keys: Sequence[str], default: int, *, least: int = 1) -> int:
    for key in keys:
        value = args.get(key)
        if isinstance(value, bool) or value is None:
            continue
        try:
            return max(least, int(str(value)))
        except ValueError:
            return default  # the real-parser check names a value SGLang refuses
    return default


def _gpu_order(devices: Iterable[str]) -> list[str]:
    return sorted(devices, key=lambda d: (len(d), d))


def _float_arg(args: dict[str, ArgValue], key: str) -> float | None:
    value = args.get(key)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(str(value))
    except ValueError:
        return None


def _uses_gpus(command: Sequence[str]) -> bool:
    head = posixpath.basename(command[0]) if command else ""
    return head not in _SIMULATOR_COMMANDS and _SIMULATOR_MODULE not in command


def _profile_gpus(args: dict[str, ArgValue], env: dict[str, str]) -> tuple[frozenset[str], str]:
    """The devices one profile's engine opens: SGLang takes `tp × pp` of them (× dp without DP
    attention, which we cannot tell apart here: counted, the safer side), from `--base-gpu-id` on,
    out of CUDA_VISIBLE_DEVICES when it is set."""
    count = _int_arg(args, _TP_KEYS, 1) * _int_arg(args, _PP_KEYS, 1)
    if not args.get("enable-dp-attention"):
        count *= _int_arg(args, _DP_KEYS, 1)
    base = _int_arg(args, ("base-gpu-id",), 0, least=0)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
        return frozenset(devices[base:base + count]), f"CUDA_VISIBLE_DEVICES={visible}"
    return frozenset(str(i) for i in range(base, base + count)), "no CUDA_VISIBLE_DEVICES: GPUs from 0"


def claims_of(config: Config, source: str) -> ModelClaims:
    endpoints = [Endpoint("engine.port", config.engine.host, config.engine.port)]
    if config.metrics.enabled:
        try:
            host, port = parse_address(config.metrics.address)
        except AddressError:
            pass  # the schema refused it already; nothing to compare
        else:
            if port != 0:
                endpoints.append(Endpoint("metrics.address", host, port))
    gpus: set[str] | None = set() if _uses_gpus(config.engine.command) else None
    gpu_key = "CUDA_VISIBLE_DEVICES"
    mem: float | None = None
    for profile in config.profile_names:
        try:
            args, env = effective_overlay(config, profile)
        except ValueError:
            continue  # a cycle: the configuration's own check reports it
        if gpus is not None:
            devices, gpu_key = _profile_gpus(args, env)
            gpus |= devices
        fraction = _float_arg(args, _MEM_KEY)
        if fraction is not None:
            mem = fraction if mem is None else max(mem, fraction)
    state_dir = posixpath.normpath(config.state_dir)
    return ModelClaims(
        name=config.name, source=source, endpoints=tuple(endpoints),
        log_file=posixpath.normpath(config.engine.log_file),
        state_file=posixpath.join(state_dir, f"{config.name}.state.json"),
        gateway_record=posixpath.join(state_dir, "gateway.json") if config.gateway.url else None,
        gpus=None if gpus is None else frozenset(gpus), gpu_key=gpu_key, mem_fraction=mem)


def _host(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return _LOOPBACK_NAMES.get(host, host)


def hosts_overlap(a: str, b: str) -> bool:
    """Whether two listeners on one port would collide: the same address, or either binds every
    address (a wildcard takes the port on loopback too)."""
    ha, hb = _host(a), _host(b)
    return ha == hb or ha in _WILDCARDS or hb in _WILDCARDS


def free_port(start: int, taken: Iterable[int], *, step: int = 1, limit: int = 65535) -> int | None:
    """The first port from `start` (by `step`) that nobody claims; None when the range is spent."""
    used = set(taken)
    port = start
    while port <= limit:
        if port not in used:
            return port
        port += step
    return None


def claimed_ports(claims: Iterable[ModelClaims]) -> set[int]:
    return {e.port for c in claims for e in c.endpoints}


def _who(c: ModelClaims) -> str:
    return f"model {c.name!r} ({c.source})"


def _loser(e: Endpoint, o: Endpoint) -> str:
    if "engine.port" in (e.what, o.what):
        return "an engine that finds its port taken waits on port_in_use, then exits 75"
    return "the second supervisor cannot serve /metrics, /status and /readyz"


def _port_fix(mine: Endpoint, ports: set[int]) -> str:
    free = free_port(mine.port + 1, ports)
    hint = f" (e.g. {free}, which no model on this host claims)" if free is not None else ""
    if mine.what == "metrics.address":
        host = f"[{mine.host}]" if ":" in mine.host else mine.host
        hint = f" (e.g. {host}:{free}, which no model on this host claims)" if free is not None else ""
    return f"give this model another {mine.what}{hint}; each model on a host needs its own"


def clashes(mine: ModelClaims, others: Sequence[ModelClaims]) -> list[ConfigProblem]:
    """Every claim of `mine` that another model on the host also makes, naming both and the fix.

    Long because: one comparison per kind of claim, each with its own fix text."""
    problems: list[ConfigProblem] = []
    everyone = [mine, *others]
    ports = claimed_ports(everyone)
    for other in others:
        for e in mine.endpoints:
            for o in other.endpoints:
                if e.port == o.port and hosts_overlap(e.host, o.host):
                    problems.append(ConfigProblem(
                        e.what, f"port {e.port} ({e.host}) is also {o.what} of {_who(other)}: "
                                f"only one can listen on it ({_loser(e, o)})",
                        _port_fix(e, ports)))
        if mine.log_file == other.log_file:
            problems.append(ConfigProblem(
                "engine.log_file", f"{mine.log_file} is also the engine log of {_who(other)}: "
                                   "two engines would interleave and rotate one file",
                f"set engine.log_file to e.g. /var/log/sglang-supervisor/{mine.name}-engine.log"))
        if mine.state_file == other.state_file:
            problems.append(ConfigProblem(
                "name", f"{mine.state_file} is also the state file of {_who(other)} (same name and "
                        "state_dir): known-bad profiles and baselines of one would be the other's",
                "give each configuration its own top-level name (sglang-model add NAME sets it)"))
        elif (mine.gateway_record is not None and mine.gateway_record == other.gateway_record):
            problems.append(ConfigProblem(
                "state_dir", f"{mine.gateway_record} would hold the gateway registration of both this "
                             f"model and {_who(other)}: after a crash one would remove the other's",
                f"give this model its own state_dir, e.g. /var/lib/sglang-supervisor/{mine.name}"))
        problems += _gpu_clash(mine, other)
    return problems


def _gpu_clash(mine: ModelClaims, other: ModelClaims) -> list[ConfigProblem]:
    if mine.gpus is None or other.gpus is None:
        return []
    shared = mine.gpus & other.gpus
    if not shared:
        return []
    if (mine.mem_fraction is not None and other.mem_fraction is not None
            and mine.mem_fraction + other.mem_fraction <= 1.0):
        return []  # sized to share: their static memory fits together
    return [ConfigProblem(
        "engine.env.CUDA_VISIBLE_DEVICES",
        f"GPU {','.join(_gpu_order(shared))} ({mine.gpu_key}, TP size) is also used by {_who(other)}: "
        "the second engine finds its memory taken (gpu_busy or kv_cache_oom)",
        f"give each model its own GPUs with engine.env.CUDA_VISIBLE_DEVICES (taken on this host: "
        f"{','.join(_gpu_order(mine.gpus | other.gpus))}), or size both to share with "
        "mem-fraction-static summing to at most 1.0")]
