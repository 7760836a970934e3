"""SIGHUP: re-read the configuration, apply every changed key or refuse the reload with the reason.

Reloads arrive through the inbox and the lifecycle loop awaits each to its end, so two reloads
never interleave (`inbox.py`). Which keys a reload can apply is `core.reloadplan`'s call; whether
the engine restarts is the lifecycle's (`ReloadRequested`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from sglang_supervisor.core import reloadplan
from sglang_supervisor.core.actions import RollBack
from sglang_supervisor.core.canary import CanaryPlan
from sglang_supervisor.core.config import Config, ConfigError
from sglang_supervisor.core.inputs import Input, ReloadRequested, Settings
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.phases import UP_PHASES
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell import reloadcheck, upgradecheck
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.engineproc.preflight import Prepared, prepare
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.telemetry.logsetup import set_redactions
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics
from sglang_supervisor.shell.telemetry.notify import Notifier
from sglang_supervisor.shell.upgrades import Upgrades

log = structlog.get_logger("sglang_supervisor")

# A reload holds the lifecycle loop's inbox (signals wait for it): the file, the engine's version
# (`version: auto` runs its interpreter, bounded at 30 s) and the rendering must be done by then.
READ_TIMEOUT_S = 60.0

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a daemon thread of its own. Not `asyncio.to_thread`: a read that never
    returns (a FIFO, a hung NFS mount) would keep the default executor's thread, and
    `asyncio.run` and the interpreter join that thread at exit, so the supervisor could never
    stop. A daemon thread is abandoned at exit instead."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()  # structlog's bound fields, as to_thread would carry

    def settle(result: T | None, exc: BaseException | None) -> None:
        if fut.done():  # the waiter gave up (wait_for timed out, or we are stopping)
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = ctx.run(fn, *args)
        except BaseException as exc:  # handed to the awaiting task, which decides
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"off-loop-{getattr(fn, '__name__', 'call')}",
                     daemon=True).start()
    return await fut


@dataclass(frozen=True)
class ReloadHooks:
    """What a reload asks of the Supervisor and tells the other parts, wired in supervisor.py."""

    feed: Callable[[Input], None]  # the applied reload, to the lifecycle
    settings: Callable[[], Settings]  # the lifecycle's settings for the new ladder (not a first run)
    fingerprint: Callable[[Prepared], str]  # a reload's fingerprint, before it is applied
    # The engine serves on unchanged under a new fingerprint: it is that ladder's last good one.
    still_serving: Callable[[str], None]
    probe_settings_changed: Callable[[], None]  # probe: changed and the engine did not restart


class Reloader:
    def __init__(self, current: Current, lifecycle: Lifecycle, upgrades: Upgrades, notifier: Notifier,
                 metrics: SupervisorMetrics, *, config_path: str | None, hooks: ReloadHooks) -> None:
        self.current, self.lifecycle, self.upgrades = current, lifecycle, upgrades
        self.notifier, self.metrics, self.config_path = notifier, metrics, config_path
        self.feed, self.settings, self.fingerprint = hooks.feed, hooks.settings, hooks.fingerprint
        self.still_serving, self.probe_settings_changed = hooks.still_serving, hooks.probe_settings_changed
        self.seq = 0  # reloads begun, for the log and /status
        # The last reload's outcome for /status, and the note STATUS= carries while it was refused.
        self.last: dict[str, Any] | None = None
        self.note: str | None = None
        self._give_up: asyncio.Future[str] | None = None  # set while a reload reads its file
        # What served before the reload whose command is not yet READY: the configuration, its
        # rendering and fingerprint, put back by `roll_back` if that command fails.
        self.previous: tuple[Config, Prepared, str] | None = None

    def with_note(self, text: str) -> str:
        """STATUS= text; after a refused reload it says so until a reload is applied: `systemctl
        status` is where an operator looks, and the next tok/s refresh must not hide it. An
        upgrade canary under way says so too."""
        text = text if self.note is None else f"{text}; {self.note}"
        upgrade = self.upgrades.note()
        return text if upgrade is None else f"{text}; {upgrade}"

    async def reload(self, requests: int = 1) -> None:
        """Re-read the configuration; the engine restarts only if its command changed."""
        self.seq += 1
        log.info("supervisor.reload_begin", seq=self.seq, requests=requests)
        result: dict[str, Any] = {"result": "unfinished"}  # cancelled by our exit, or a bug
        try:
            await self._reload()
            result = self.last or result
        finally:
            log.info("supervisor.reload_end", seq=self.seq, result=result["result"],
                     changed=result.get("changed"))

    async def _reload(self) -> None:
        cur = self.current
        path = self.config_path
        if path is None:
            self.refuse("no configuration file to re-read", "no_config")
            return
        try:
            read = await self._read_or_give_up(path)
            if read is None:
                return
            prepared, new_fp, canary = read
        except ConfigError as exc:
            self._refuse_invalid(exc)
            return
        # From here on nothing is awaited: the reload is applied whole, or not at all.
        if not self._canary_may_start(canary):
            return
        config = prepared.config
        current = self.lifecycle.profile
        old = cur.prep.renders.get(current) if current else None
        new = prepared.renders.get(current) if current else None
        changed = (old is None or new is None or old.argv != new.argv or old.env != new.env
                   or old.secret_config != new.secret_config)
        refused = reloadplan.refused_keys(cur.config, config, engine_restarts=changed)
        if refused:
            self.refuse(reloadplan.refusal_reason(refused), "not_applicable",
                        keys=",".join(sorted(refused)))
            return
        probe_changed = config.probe != cur.config.probe
        keys = reloadplan.changed_keys(cur.config, config)
        before, armed = (cur.config, cur.prep, cur.fp), self.lifecycle.rollback_to is not None
        cur.prep = prepared
        # Baselines, last good and known bad belong to the commands that earned them: the new
        # ladder has its own.
        old_fp, cur.fp = cur.fp, new_fp
        if cur.fp != old_fp:
            log.info("supervisor.fingerprint_changed", old=old_fp, new=cur.fp)
        if secrets := [k for k in (prepared.api_key, prepared.gateway_key) if k]:
            set_redactions(secrets)
        self.note = None
        self.last = {"result": "applied", "at": time.time(), "seq": self.seq, "changed": keys[:50],
                     "restarts_engine": changed}
        self.metrics.reload_result("applied")
        self.feed(ReloadRequested(changed, self.settings(), self.upgrades.begin(canary)))
        self._keep_for_rollback(before, armed)
        if not changed and current and cur.fp != old_fp and self.lifecycle.phase in UP_PHASES:
            # The engine runs on, unchanged: it is the last good one of the new ladder too (else a
            # restart of the supervisor would forget it), and /metrics names the new fingerprint.
            self.still_serving(current)
        if probe_changed and not changed:
            self.probe_settings_changed()

    def _refuse_invalid(self, exc: ConfigError) -> None:
        """A broken file must not take a healthy engine down: keep running what we have (a
        candidate that cannot run the tuned profile is remembered as refused)."""
        if isinstance(exc, upgradecheck.CandidateRefused):
            self.upgrades.refused(exc.python, exc.version, exc.reason)
        first = exc.problems[0] if exc.problems else None
        why = f"{len(exc.problems)} configuration problem(s)" + (
            f", first: {first.path or 'file'}: {first.problem}" if first else "")
        self.refuse(why[:300], "invalid", report=str(exc))

    def _canary_may_start(self, canary: CanaryPlan | None) -> bool:
        """A canary needs a serving engine: one to compare with, and to return to."""
        if canary is None or self.lifecycle.phase in UP_PHASES:
            return True
        self.refuse("an upgrade canary needs a serving engine to compare with and to return to; "
                    "reload again once it serves", "not_serving")
        return False

    def _keep_for_rollback(self, before: tuple[Config, Prepared, str], armed: bool) -> None:
        """The lifecycle arms a rollback when this reload restarts a serving engine: what ran
        until now is then what comes back; one armed by an earlier reload keeps its own."""
        if self.lifecycle.rollback_to is None:
            self.previous = None
        elif not armed:
            self.previous = before

    def roll_back(self, action: RollBack) -> None:
        """The reloaded command failed before READY (`action`): the configuration that served
        before comes back whole, and the refused change is reported like a refused reload (the
        journal had the lifecycle's `supervisor.reload_rolled_back`)."""
        cur = self.current
        if self.previous is None:  # armed only together (see _reload): a bug if it happens
            log.error("supervisor.rollback_missing", profile=action.profile)
            return
        _, cur.prep, cur.fp = self.previous
        self.previous = None
        if secrets := [k for k in (cur.prep.api_key, cur.prep.gateway_key) if k]:
            set_redactions(secrets)
        reason = f"{action.failure_class}: {action.message}"[:300]
        self.note = f"reload rolled back ({action.failure_class}), previous config serves"[:200]
        self.last = {"result": "rolled_back", "at": time.time(), "seq": self.seq,
                     "reason": reason, "failure_class": action.failure_class,
                     "profile": action.profile}
        self.metrics.reload_result("rolled_back")

    def abandon_read(self, why: str) -> None:
        """Give up the reload being read, if one is (a stop is waiting behind it)."""
        if self._give_up is not None and not self._give_up.done():
            self._give_up.set_result(why)

    async def _read_or_give_up(self, path: str) -> tuple[Prepared, str, CanaryPlan | None] | None:
        """The new configuration, or None when the reload gave up (and was refused): the
        loop handles nothing else from its inbox meanwhile, so the read is bounded in time and a
        stop signal ends it. Raises ConfigError for a file that is read but invalid."""
        loop = asyncio.get_running_loop()
        self._give_up = give_up = loop.create_future()
        reading = asyncio.ensure_future(self._read(path))
        try:
            await asyncio.wait({reading, give_up}, timeout=READ_TIMEOUT_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._give_up = None
            if not reading.done():
                reading.cancel()  # the thread under it stays blocked; it is a daemon (off_loop)
        if reading.done():
            return reading.result()
        if give_up.done():
            self.refuse(f"abandoned: {give_up.result()}", "abandoned")
            return None
        give_up.cancel()
        self.refuse(f"reading and rendering the configuration took more than {READ_TIMEOUT_S:g} s "
                    "(a file on a hung mount? a FIFO?)", "timeout")
        return None

    async def _read(self, path: str) -> tuple[Prepared, str, CanaryPlan | None]:
        """The file read, validated and rendered, and its fingerprint: all off the loop (`version:
        auto` runs the engine's interpreter; NVML may be slow), in one thread."""
        return await off_loop(self._read_blocking, path)

    def _read_blocking(self, path: str) -> tuple[Prepared, str, CanaryPlan | None]:
        config = load_config(path)
        python, is_canary = self.upgrades.candidate(config)
        canary: CanaryPlan | None = None
        if python is not None:
            config, canary = upgradecheck.candidate_for_reload(
                config, self.current.prep.version, python, self.upgrades.plan)
            if not is_canary:
                canary = None
        prepared = prepare(config, self._version(config))  # the catalogue: flags, types, choices
        changed = reloadcheck.changed_profiles(self.current.prep, prepared)
        problems, why_not = reloadcheck.real_parser_problems(prepared, changed, os.environ)
        if problems:
            raise ConfigError(problems, "the installed SGLang's argument parser")
        if why_not is not None and changed:
            log.info("supervisor.reload_parser_skipped", profiles=",".join(changed), why=why_not,
                     hint="the changed profiles were checked against the flag catalogue only")
        return prepared, self.fingerprint(prepared), canary

    def refuse(self, reason: str, kind: str, **fields: Any) -> None:
        """Keep everything as it runs, and say why where operators look: the journal, STATUS=
        (`systemctl status`), /status and a metric."""
        log.error("supervisor.reload_failed", reason=reason, kind=kind,
                  kept_profile=self.lifecycle.profile, **fields,
                  hint="the running configuration is unchanged; fix the file and reload again "
                       "(sglang-supervisor check --config FILE shows every problem)")
        self.note = f"reload refused: {reason}"[:200]
        self.last = {"result": "refused", "at": time.time(), "seq": self.seq, "reason": reason}
        self.metrics.reload_result("refused")
        text = self.with_note(self.lifecycle.status_text())
        if self.lifecycle.ready_sent and self.lifecycle.phase in UP_PHASES:
            self.notifier.reloading(text)
            self.notifier.ready(text)
        else:
            self.notifier.status(text)

    def _version(self, config: Config) -> str:
        cur = self.current
        if config.engine.version == cur.config.engine.version and config.engine.command == (
                cur.config.engine.command):
            return cur.prep.version
        return detect_engine_version(config)
