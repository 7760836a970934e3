"""How this replica shows itself to a fleet (docs/OPERATIONS.md): its gateway registration, the
drain before planned stops, /readyz, /livez (the loop's heartbeat), and reaping orphaned zombies
as a container's PID 1. What is ready, alive or planned is `core.rotation`'s call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.liveness import stop_extension
from sglang_supervisor.core.rotation import Verdict, liveness, planned, readiness
from sglang_supervisor.shell.checks.probe import engine_load
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.engineproc.reaper import Reaper
from sglang_supervisor.shell.links.fleet import GatewayAgent
from sglang_supervisor.shell.telemetry.notify import Notifier

# The loop's heartbeat (/livez, zombie reaping) and how old it may get before /livez fails.
HEARTBEAT_S = 1.0
LIVENESS_STALE_S = 15.0


class Presence:
    def __init__(self, current: Current, lifecycle: Lifecycle, registry: CollectorRegistry,
                 notifier: Notifier, engine_pid: Callable[[], int | None]) -> None:
        self.current, self.lifecycle, self.registry = current, lifecycle, registry
        self.notifier = notifier
        self._engine_pid = engine_pid  # the running engine's, which its Popen reaps
        self.gateway: GatewayAgent | None = None
        self.draining = False
        self._heartbeat = time.monotonic()
        self._reaper = Reaper.for_this_process(self._known_children)

    def start(self) -> None:
        cur = self.current
        gw = cur.config.gateway
        if gw.enabled:
            self.gateway = GatewayAgent(gw, cur.base_url, cur.config.state_dir, self.registry,
                                        api_key=cur.prep.gateway_key, engine_api_key=cur.prep.api_key)
            self.gateway.start()

    async def aclose(self) -> None:
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                await self.gateway.aclose()

    def status(self) -> dict[str, Any] | None:
        return self.gateway.status() if self.gateway else None

    def readiness(self) -> Verdict:
        return readiness(self.lifecycle.snapshot(time.monotonic()), draining=self.draining)

    def liveness(self) -> Verdict:
        return liveness(time.monotonic() - self._heartbeat, stale_s=LIVENESS_STALE_S)

    async def beat(self) -> None:
        """The heartbeat /livez reads; as PID 1 of a container it also reaps orphaned zombies."""
        while True:
            self._heartbeat = time.monotonic()
            self._reaper.reap()
            await asyncio.sleep(HEARTBEAT_S)

    def reap_all(self) -> None:
        """The end of the shutdown, as PID 1: every child left (the engine's, re-parented to us
        while it stopped) is reaped, waiting at most kill_s for those still dying."""
        self._reaper.reap_all(self.current.config.timeouts.kill_s)

    def _known_children(self) -> set[int]:
        """Our own children, reaped by whoever started them (Popen), never by the reaper."""
        pid = self._engine_pid()
        return {pid} if pid is not None else set()

    def on_ready(self) -> None:
        self.draining = False
        if self.gateway is not None:
            self.gateway.on_ready()

    def engine_crashed(self) -> None:
        """Out of the gateway before anything else."""
        if self.gateway is not None:
            self.gateway.on_engine_gone()

    async def before_stop(self, reason: str) -> None:
        """The one hook every stop of the engine passes, before SIGTERM reaches it: a planned stop
        leaves the gateway and waits for in-flight requests (bounded by gateway.drain_s); a
        failure stop only leaves the gateway, in the background."""
        if self.gateway is None:
            return
        if not planned(reason):
            self.gateway.on_engine_gone()
            return
        self.draining = True
        # systemd's stop (or reload) deadline must cover the drain that is about to happen.
        config = self.current.config
        t = config.timeouts
        self.notifier.extend_timeout(stop_extension(gateway_drain_s=config.gateway.drain_s,
                                                        drain_s=t.drain_s, kill_s=t.kill_s))
        await self.gateway.drain(reason, self._inflight)

    async def _inflight(self) -> int | None:
        cur = self.current
        assert cur.client is not None
        load = await engine_load(cur.client, cur.base_url, cur.prep.api_key,
                                 timeout=cur.config.gateway.timeout_s)
        return None if load is None else load.running + load.queued
