"""The supervisor's side of a fleet: registration with the SGLang Model Gateway and the drain
before a planned stop.

`GatewayAgent` is an adapter: decisions come from `rotation`, HTTP from `gateway`. Its promise to
the supervisor: nothing here raises, and nothing here waits longer than its own bound
(`gateway.timeout_s` per call, `gateway.drain_s` per drain) -- the gateway being down, slow or
answering garbage costs a warning and a metric, never the engine's lifecycle.

Registration runs in a background task after READY (retried with backoff until it succeeds or a
stop begins). The id the gateway gave is written to `<state_dir>/gateway.json`, so that after a
supervisor crash the next start removes the stale registration first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from sglang_supervisor.core.config import GatewaySettings
from sglang_supervisor.core.rotation import (
    DRAIN_RESULTS,
    Registration,
    advertise_problem,
    backoff_s,
    drain_result,
    drained,
    parse_registration,
    retry_pause_s,
)
from sglang_supervisor.core.secretforms import KEY_FIX, api_key_problem
from sglang_supervisor.shell.links.gateway import PROBLEMS, GatewayAnswer, GatewayClient

log = structlog.get_logger("sglang_supervisor")

NS = "sglang_supervisor"
RECORD_FILE = "gateway.json"
OPS = ("register", "deregister", "list")
DRAIN_POLL_S = 0.25
# Seconds to wait for the gateway to stop listing us after DELETE (it answers 202: a job).
REMOVAL_POLL_S = 0.2
# While registered, how often to check that the gateway still lists us: a restarted gateway
# forgets workers registered through its API.
WATCH_S = 30.0

RETRY_HINT = "the engine keeps serving; the call is retried with backoff"
DEREGISTER_RETRY_HINT = ("retried with backoff until it succeeds or gateway.drain_s is spent; "
                         "the engine keeps serving meanwhile")
DEREGISTER_ONCE_HINT = ("not retried: the engine is gone and the gateway's own health check drops "
                        "it; the id stays in gateway.json and the next start removes it")
WATCH_HINT = f"the engine keeps serving; the list is read again in {WATCH_S:g} s"
ADOPT_HINT = ("not retried: the stop goes on; a registration the gateway made stays in its list "
              "until its health check drops the engine")
REMOVAL_HINT = ("not retried: the drain cannot tell whether the gateway still lists the engine and "
                "goes on to wait for its in-flight requests")
DRAIN_HINTS = {
    "deregister_failed": "the gateway may still route to this engine when it stops: it was never "
                         "told (every DELETE failed within gateway.drain_s); its health check drops "
                         "the engine later and the next start removes the stale id",
    "still_listed": "the gateway accepted the DELETE but still listed the engine when "
                    "gateway.drain_s ran out; raise gateway.drain_s if requests are lost",
    "timeout": "requests were still in flight when gateway.drain_s ran out; SIGTERM's own drain "
               "(timeouts.drain_s) follows",
    "load_unknown": "the engine's load could not be read; waited the whole gateway.drain_s",
}

# The engine's in-flight requests (running + queued), None when it cannot tell.
LoadReader = Callable[[], Awaitable[int | None]]


def read_gateway_key(path: str | None) -> str | None:
    """The gateway's API key from its file (one line); None without a file. OSError/ValueError
    name the problem (the caller turns them into a configuration error)."""
    if path is None:
        return None
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text or "\n" in text:
        raise ValueError(f"{path} must hold the gateway API key on one line")
    # Redacted from every log like the engine's key (a gateway may quote it): the same length rule.
    problem = api_key_problem(text)
    if problem is not None:
        raise ValueError(f"{path}: {problem}; {KEY_FIX} (also as the gateway's --api-key)")
    return text


class GatewayMetrics:
    """Families in the supervisor's registry; every series exists from the start at 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(f"{NS}_gateway_calls", "calls to the SGLang Model Gateway by result",
                             ["op", "result"], registry=registry)
        self.registered = Gauge(f"{NS}_gateway_registered",
                                "1 while the engine is registered with the gateway", registry=registry)
        self.drains = Counter(f"{NS}_drains", "drains before a planned stop by result", ["result"],
                              registry=registry)
        self.drain_seconds = Gauge(f"{NS}_drain_seconds",
                                   "seconds the last drain took (deregister to no request in flight)",
                                   registry=registry)
        for op in OPS:
            for result in ("ok", *PROBLEMS):
                self.calls.labels(op, result)
        for result in DRAIN_RESULTS:
            self.drains.labels(result)


class GatewayAgent:
    def __init__(self, settings: GatewaySettings, engine_url: str, state_dir: str,
                 registry: CollectorRegistry, *, api_key: str | None,
                 engine_api_key: str | None = None, client: GatewayClient | None = None,
                 watch_s: float = WATCH_S) -> None:
        assert settings.url is not None
        self.settings = settings
        self.gateway_url = settings.url
        self.engine_url = settings.advertise_url or engine_url
        self.record_path = Path(state_dir) / RECORD_FILE
        self.metrics = GatewayMetrics(registry)
        self.client = client or GatewayClient(settings.url, api_key=api_key, timeout_s=settings.timeout_s)
        self.engine_api_key = engine_api_key
        self.watch_s = watch_s
        self.worker_id: str | None = None
        self.last_problem: str | None = None
        self._warned: set[str] = set()  # ops warned about in the current failure streak
        self._register_task: asyncio.Task[None] | None = None
        self._stale_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- what the supervisor calls -----------------------------------------------------------

    def start(self) -> None:
        """A registration left by a previous run (crash, SIGKILL) is removed in the background."""
        problem = advertise_problem(self.gateway_url, self.engine_url)
        if problem is not None:
            log.warning("gateway.advertise_loopback", problem=problem,
                        fix="set gateway.advertise_url to a URL of this engine that the gateway "
                            "can reach (e.g. http://<this host's address>:<engine.port>)")
        stale = self._load_record()
        if stale is not None:
            self._stale_task = self._in_background(self._remove_stale(stale))

    def on_ready(self) -> None:
        """READY=1: register (idempotent: the gateway gives one URL one id)."""
        if self._register_task is not None and not self._register_task.done():
            return
        self._register_task = self._in_background(self._register_loop())

    def on_engine_gone(self) -> None:
        """The engine died or is being stopped for a failure: leave the gateway now, no drain
        (one attempt: the gateway's own health check drops a dead engine anyway)."""
        self._cancel_register()
        if self.worker_id is not None:
            self._in_background(self._deregister_once())

    async def drain(self, reason: str, load: LoadReader) -> None:
        """Before a planned stop: deregister, wait until the gateway no longer routes to us and
        the engine has nothing in flight -- all within gateway.drain_s, then return."""
        registering = self._register_task is not None and not self._register_task.done()
        self._cancel_register()
        began = time.monotonic()
        deadline = began + self.settings.drain_s
        if self.worker_id is None and registering:
            # A POST may have reached the gateway before we cancelled it: find our id by URL.
            await self._adopt_listed_id()
        if self.worker_id is None:
            # Never in the gateway's list (not READY yet, or the gateway was down): no gateway
            # traffic to wait for; a stop during startup must not sit out drain_s.
            log.info("gateway.drain_skipped", reason=reason, why="not registered")
            return
        attempts, deregistered = await self._deregister_until(deadline)
        still_listed = await self._await_removal(deadline) if deregistered else None
        load_result = await self._await_idle(load, deadline)
        result = drain_result(deregistered=deregistered, still_listed=still_listed,
                              load_result=load_result)
        seconds = round(time.monotonic() - began, 3)
        self.metrics.drains.labels(result).inc()
        self.metrics.drain_seconds.set(seconds)
        fields: dict[str, Any] = {
            "reason": reason, "result": result, "seconds": seconds, "drain_s": self.settings.drain_s,
            "deregistered": deregistered, "deregister_attempts": attempts,
            "still_listed": still_listed}
        if result == "drained":
            log.info("gateway.drained", **fields)
        else:
            log.warning("gateway.drained", **fields, hint=DRAIN_HINTS[result])

    async def aclose(self) -> None:
        self._cancel_register()
        tasks = list(self._background)
        if tasks:
            # Deregistrations in flight get their one call's deadline, nothing more.
            await asyncio.wait(tasks, timeout=self.settings.timeout_s + 1.0)
        for t in self._background:
            t.cancel()
        await self.client.aclose()

    def status(self) -> dict[str, Any]:
        return {"url": self.gateway_url, "advertised": self.engine_url,
                "registered": self.worker_id is not None, "worker_id": self.worker_id,
                "last_problem": self.last_problem}

    # -- internals -----------------------------------------------------------------------------

    def _in_background(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _cancel_register(self) -> None:
        if self._register_task is not None:
            self._register_task.cancel()
            self._register_task = None

    def _count(self, op: str, answer: GatewayAnswer, *, hint: str = RETRY_HINT) -> None:
        """One metric per call; one warning per failure streak and op; recovery is logged once.
        `hint` says what happens next, as this caller does it (never a retry it does not make)."""
        self.metrics.calls.labels(op, answer.result).inc()
        if answer.ok:
            if op in self._warned:
                self._warned.discard(op)
                log.info("gateway.recovered", op=op, gateway=self.gateway_url)
            self.last_problem = None
            return
        self.last_problem = f"{op}: {answer.problem}"
        if op not in self._warned:
            self._warned.add(op)
            log.warning("gateway.unavailable", op=op, problem=answer.problem, detail=answer.detail,
                        gateway=self.gateway_url, hint=hint)

    async def _register_loop(self) -> None:
        if self._stale_task is not None:
            # The gateway gives one URL one id: removing the stale one after registering anew
            # would remove us. The stale removal is bounded (three calls).
            await asyncio.wait([self._stale_task])
        while True:
            await self._register()
            await self._watch()  # returns when the gateway no longer lists us

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_s)
            answer = await self.client.workers()
            self._count("list", answer, hint=WATCH_HINT)
            if answer.ok and not any(w.url == self.engine_url for w in answer.workers):
                log.warning("gateway.forgot_us", worker_id=self.worker_id, gateway=self.gateway_url,
                            hint="the gateway restarted or the worker was removed by hand; "
                                 "registering again")
                self.worker_id = None
                self.metrics.registered.set(0)
                return

    async def _register(self) -> None:
        failures = 0
        while True:
            answer = await self.client.add_worker(self.engine_url, self.engine_api_key)
            self._count("register", answer)
            if answer.ok and answer.worker_id is not None:
                self.worker_id = answer.worker_id
                self.metrics.registered.set(1)
                self._save_record(Registration(self.gateway_url, self.engine_url, answer.worker_id))
                log.info("gateway.registered", worker_id=answer.worker_id, url=self.engine_url,
                         gateway=self.gateway_url)
                return
            failures += 1
            await asyncio.sleep(backoff_s(failures, max_s=self.settings.retry_max_s))

    async def _adopt_listed_id(self) -> None:
        answer = await self.client.workers()
        self._count("list", answer, hint=ADOPT_HINT)
        if answer.ok:
            self.worker_id = next((w.worker_id for w in answer.workers
                                   if w.url == self.engine_url and w.worker_id), None)

    async def _deregister(self, *, retried: bool = False) -> bool:
        """One DELETE; True when the gateway no longer has our id (removed, or it never knew it)."""
        wid = self.worker_id
        if wid is None:
            return True
        answer = await self.client.remove_worker(wid)
        self._count("deregister", answer, hint=DEREGISTER_RETRY_HINT if retried else
                    DEREGISTER_ONCE_HINT)
        if answer.ok or answer.problem == "unknown_worker":
            # Unknown: the gateway already forgot us (restarted, removed by hand) -- we are out.
            self._forget(wid)
            log.info("gateway.deregistered", worker_id=wid, gateway=self.gateway_url,
                     known=answer.ok)
            return True
        # Else the gateway is unreachable or refusing: the record stays so the next start
        # removes it.
        return False

    async def _deregister_once(self) -> None:
        await self._deregister()

    async def _deregister_until(self, deadline: float) -> tuple[int, bool]:
        """The drain's DELETE, retried with backoff until it succeeds or drain_s is spent:
        (attempts, deregistered). The first attempt has its whole call deadline (the documented
        stop bound allows one); every retry fits in what is left of drain_s."""
        attempts = 1
        if await self._deregister(retried=True):
            return attempts, True
        while (pause := retry_pause_s(attempts, deadline - time.monotonic(),
                                      max_s=self.settings.retry_max_s)) is not None:
            await asyncio.sleep(pause)
            attempts += 1
            try:
                if await asyncio.wait_for(self._deregister(retried=True),
                                          max(0.0, deadline - time.monotonic())):
                    return attempts, True
            except asyncio.TimeoutError:
                break
        return attempts, False

    def _forget(self, wid: str) -> None:
        if self.worker_id == wid:
            self.worker_id = None
            self.metrics.registered.set(0)
        with contextlib.suppress(OSError):
            record = self._load_record()
            if record is None or record.worker_id == wid:
                self.record_path.unlink()

    async def _await_removal(self, deadline: float) -> bool | None:
        """DELETE is a job: wait (bounded) until GET /workers no longer lists our URL. Whether
        the gateway still listed us at the end; None when it could not tell."""
        listed: bool | None = None  # no time left to look at all: cannot tell
        while (left := deadline - time.monotonic()) > 0:
            # Within what is left of drain_s: a gateway that lists slowly (each call may take
            # gateway.timeout_s) must not stretch the documented stop bound.
            try:
                answer = await asyncio.wait_for(self.client.workers(), left)
            except asyncio.TimeoutError:
                return None
            self._count("list", answer, hint=REMOVAL_HINT)
            if not answer.ok:
                return None  # cannot tell; the in-flight wait still protects the requests
            if not any(w.url == self.engine_url for w in answer.workers):
                return False
            listed = True
            await asyncio.sleep(REMOVAL_POLL_S)
        return listed

    async def _await_idle(self, load: LoadReader, deadline: float) -> str:
        streak = 0
        seen_load = False
        while True:
            try:
                inflight = await asyncio.wait_for(load(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                inflight = None
            seen_load = seen_load or inflight is not None
            done, streak = drained(inflight, streak)
            if done:
                return "drained"
            if time.monotonic() >= deadline:
                return "timeout" if seen_load else "load_unknown"
            await asyncio.sleep(DRAIN_POLL_S)

    async def _remove_stale(self, stale: Registration) -> None:
        if stale.gateway_url != self.gateway_url:
            log.info("gateway.stale_elsewhere", gateway=stale.gateway_url, worker_id=stale.worker_id,
                     hint="the configuration names another gateway now; remove it there by hand")
            with contextlib.suppress(OSError):
                self.record_path.unlink()
            return
        for failures in range(1, 4):
            answer = await self.client.remove_worker(stale.worker_id)
            self._count("deregister", answer)
            if answer.ok or answer.problem == "unknown_worker":
                log.info("gateway.stale_removed", worker_id=stale.worker_id, known=answer.ok)
                if self.worker_id is None:
                    with contextlib.suppress(OSError):
                        self.record_path.unlink()
                return
            await asyncio.sleep(backoff_s(failures, max_s=self.settings.retry_max_s))

    def _load_record(self) -> Registration | None:
        try:
            with open(self.record_path, "rb") as f:
                return parse_registration(f.read(8192))
        except OSError:
            return None

    def _save_record(self, record: Registration) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        try:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(record.to_json())
            os.replace(tmp, self.record_path)
        except OSError as exc:
            log.warning("gateway.record_unwritable", path=str(self.record_path), error=exc.strerror,
                        hint="a stale registration will not be removed after a supervisor crash")
