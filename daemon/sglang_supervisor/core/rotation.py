"""Pure decisions about a replica's place in a fleet: is it ready for traffic (`/readyz`), does a
stop get the gateway drain, how long to back off, what a persisted registration says.

No I/O here: `fleet.GatewayAgent` and the supervisor carry these out.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# PLANNED_STOPS (owned by reasons.StopReason): stops the supervisor chooses while the engine
# serves well: traffic is moved away first. (Failure stops -- wedged, hang, probe failures --
# deregister too, but do not wait for a drain: the engine is not answering anyway. `tune` refuses
# to run beside a running supervisor, so its stops never touch a registered engine.)
from sglang_supervisor.core.reasons import PLANNED_STOPS

SERVING_PHASES = frozenset({"ready", "serving"})
MAX_RECORD_BYTES = 4096


def planned(stop_reason: str) -> bool:
    return stop_reason in PLANNED_STOPS  # a StopReason, or its value (equal, same hash)


@dataclass(frozen=True)
class Verdict:
    ready: bool
    reason: str  # "serving", or why not: "capturing_graphs 3/8", "draining", ...


def readiness(snapshot: Mapping[str, Any], *, draining: bool = False) -> Verdict:
    """`/readyz` from the lifecycle's snapshot: ready only after READY=1, while serving and not
    draining. A degraded engine (failing health checks) is not ready: a balancer should prefer
    the others until it recovers."""
    phase = str(snapshot.get("phase") or "unknown")
    if draining:
        return Verdict(False, "draining")
    if phase in SERVING_PHASES:
        return Verdict(True, "serving")
    if phase == "capturing_graphs":
        return Verdict(False, f"capturing_graphs {snapshot.get('captures_ended', 0)}/"
                                f"{snapshot.get('captures_expected', 0)}")
    if phase == "degraded":
        return Verdict(False, "degraded: engine health checks failing")
    attempts = snapshot.get("attempts") or []
    last = attempts[-1] if attempts and isinstance(attempts[-1], Mapping) else {}
    why = str(last.get("reason") or "")
    profile = snapshot.get("profile")
    if phase in ("launching", "loading_weights", "warming_up", "restarting") and why.startswith(
            ("fallback", "retry")):
        # "fallback no-prefill-graph after capture_oom"
        return Verdict(False, f"{why.split(' ', 1)[0]} {profile} {why.split(' ', 1)[1]}"
                         if " " in why else f"{why} {profile}")
    if phase == "stopping":
        return Verdict(False, "draining")
    return Verdict(False, phase)


def liveness(heartbeat_age_s: float, *, stale_s: float) -> Verdict:
    """`/livez`: the supervisor's own loop is alive (its heartbeat task ran recently). Never the
    engine's /health: a restarting engine is the supervisor doing its job, not a dead pod."""
    if heartbeat_age_s <= stale_s:
        return Verdict(True, "loop alive")
    return Verdict(False, f"supervisor loop stalled for {heartbeat_age_s:.0f} s")


def backoff_s(failures: int, *, first_s: float = 0.5, max_s: float = 30.0) -> float:
    """Pause before retry number `failures` (1-based): doubling from `first_s`, capped."""
    if failures <= 0:
        return 0.0
    return float(min(max_s, first_s * (2 ** min(failures - 1, 30))))


def retry_pause_s(failures: int, left_s: float, *, max_s: float) -> float | None:
    """Pause before the next retry of a call that must end within `left_s`, or None when no
    retry fits any more (the pause would use up what is left)."""
    pause = backoff_s(failures, first_s=0.25, max_s=max_s)
    return pause if pause < left_s else None


# Every result a drain can end with (a metric label), from best to worst.
DRAIN_RESULTS = ("drained", "timeout", "load_unknown", "still_listed", "deregister_failed")


def drain_result(*, deregistered: bool, still_listed: bool | None, load_result: str) -> str:
    """What one drain achieved, said plainly: "drained" only when the gateway took the DELETE, no
    longer listed us (or could not tell) and nothing was left in flight. A gateway that was never
    told, or still listed us at the bound, is named as such whatever the engine's load did, since
    it may still send requests to an engine about to stop."""
    if not deregistered:
        return "deregister_failed"
    if still_listed:
        return "still_listed"
    return load_result


def drained(inflight: int | None, zero_streak: int, *, needed: int = 2) -> tuple[bool, int]:
    """After one look at the engine's load: (done, new zero streak). Zero must be seen `needed`
    times in a row, so that a request the gateway had already routed when it dropped us (still in
    flight on the wire) is counted. None (load unknown) never counts as drained."""
    if inflight is None or inflight > 0:
        return False, 0
    streak = zero_streak + 1
    return streak >= needed, streak


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def advertise_problem(gateway_url: str, engine_url: str) -> str | None:
    """Why the engine URL we would register cannot be right for this gateway, or None. The
    default advertised URL comes from engine.host, a wildcard read as loopback: a gateway on
    another machine would then send every request to its own 127.0.0.1."""
    if _loopback(urlsplit(engine_url).hostname) and not _loopback(urlsplit(gateway_url).hostname):
        return (f"the engine is advertised as {engine_url}, a loopback address, to a gateway at "
                f"{gateway_url}; unless that gateway runs on this machine it cannot reach the engine")
    return None


@dataclass(frozen=True)
class Registration:
    """What the state dir remembers: the gateway and the id it gave this engine URL."""

    gateway_url: str
    engine_url: str
    worker_id: str

    def to_json(self) -> str:
        return json.dumps({"gateway_url": self.gateway_url, "engine_url": self.engine_url,
                           "worker_id": self.worker_id}) + "\n"


def parse_registration(text: str | bytes) -> Registration | None:
    """A persisted registration, or None when the file is empty, damaged or too large."""
    if len(text) > MAX_RECORD_BYTES:
        return None
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):  # "[[[[..." fits in 4 KiB
        return None
    if not isinstance(data, Mapping):
        return None
    gateway_url, engine_url, worker_id = (data.get(k) for k in ("gateway_url", "engine_url", "worker_id"))
    if not (isinstance(gateway_url, str) and isinstance(engine_url, str) and isinstance(worker_id, str)):
        return None
    if not (gateway_url and engine_url and worker_id):
        return None
    return Registration(gateway_url, engine_url, worker_id)
