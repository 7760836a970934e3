"""What the supervisor shows to whom: addresses off loopback, and /status on them.

A metrics port on 0.0.0.0 serves `/status` to anyone who can reach it, and an engine on a
non-loopback address without an API key serves generation to anyone: both are accepted (a fleet
needs them) but never silently -- `check` and the start-up log warn. On a non-loopback bind,
`/status` keeps its numbers and verdicts and loses what helps an attacker aim: process ids, file
paths, fingerprints and the gateway's URLs and ids (`metrics.status_detail` chooses otherwise).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from sglang_supervisor.core.address import AddressError, parse_address
from sglang_supervisor.core.config import Config, ConfigProblem

REDACTED = "***"
# Keys whose value is an id, a path or a place: replaced whatever their type.
REDACTED_KEYS = frozenset({
    "engine_pid", "pid", "pids", "engine_log", "log_file", "fingerprint", "command_hash",
    "worker_id", "url", "advertised", "path", "moved_to", "config",
})
# Inside free text (a waiting reason, a reload's refusal): absolute paths and pids.
_PATH = re.compile(r"(?<![\w.])/[^\s'\",;()\[\]{}]+")
_PID = re.compile(r"\b(pids?)([ =:]+)\d+(?:\s*,\s*\d+)*", re.IGNORECASE)


def is_loopback(host: str) -> bool:
    """Only what surely stays on this machine: 127.0.0.0/8, ::1, "localhost". A wildcard or a
    name that resolves elsewhere is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address_is_loopback(address: str) -> bool:
    try:
        host, _ = parse_address(address)
    except AddressError:
        return False
    return is_loopback(host)


def exposure_warnings(config: Config) -> list[ConfigProblem]:
    """The `check` and start-up warnings about what this configuration serves off loopback."""
    out: list[ConfigProblem] = []
    metrics = config.metrics
    if metrics.enabled and not address_is_loopback(metrics.address):
        detail = ("redacted there: pids, paths and fingerprints hidden"
                  if metrics.status_detail != "full" else "in full (metrics.status_detail: full)")
        out.append(ConfigProblem(
            "metrics.address",
            f"{metrics.address} serves /metrics and /status to every host that can reach it "
            f"(/status {detail})",
            "bind 127.0.0.1 and scrape through a local agent or proxy, or keep the port behind a "
            "firewall that admits only the scrapers"))
    engine = config.engine
    keyless = engine.api_key_file is None and engine.api_key_credential is None
    if keyless and not is_loopback(engine.host):
        out.append(ConfigProblem(
            "engine.host",
            f"the engine listens on {engine.host} without an API key: anyone who can reach port "
            f"{engine.port} can generate, read /server_info and flush the cache",
            "set engine.api_key_file (or engine.api_key_credential), or engine.host: 127.0.0.1 "
            "behind a gateway or proxy on this machine"))
    return out


def redact_status(doc: Mapping[str, Any], *, redact: bool) -> dict[str, Any]:
    """`/status`'s document as a caller off this machine may see it (when `redact`)."""
    if not redact:
        return dict(doc)
    out = _redact(doc)
    assert isinstance(out, dict)
    out["redacted"] = True
    return out


def status_redacted(detail: str, address: str) -> bool:
    """Whether `/status` on `address` is redacted under `metrics.status_detail`."""
    if detail == "full":
        return False
    if detail == "redacted":
        return True
    return not address_is_loopback(address)


def _redact(value: Any, key: str | None = None) -> Any:
    if key in REDACTED_KEYS and value is not None:
        return REDACTED
    if isinstance(value, Mapping):
        return {k: _redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v) for v in value]
    if isinstance(value, str):
        return _PID.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", _PATH.sub(REDACTED, value))
    return value
