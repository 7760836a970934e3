"""The daemon's fidelity checks: at the ready gate (before READY=1, so after every profile change
too), and periodically while serving when the engine is idle. Verdicts are core/fidelity.judge's;
a mismatch goes to the lifecycle as `FidelityFailed` (failure class `output_mismatch`), a sample
that could not be taken as `ProbeFailed` (the supervisor's trouble, never a mismatch).

The reference is taken at the ready gate of the reference profile when the model has none yet
(the most conservative profile that reached READY); `sglang-supervisor fidelity --reset` re-takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from sglang_supervisor.core import canary as C
from sglang_supervisor.core import fidelity as F
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.inputs import FidelityFailed, Input, ProbeFailed
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.phases import UP_PHASES
from sglang_supervisor.core.profiles import RenderedCommand
from sglang_supervisor.shell.checks.enginehttp import engine_client
from sglang_supervisor.shell.checks.fidelity import (
    Reference,
    ReferenceStore,
    SampleUnavailable,
    dtype_of,
    key_for,
    take_sample,
)
from sglang_supervisor.shell.checks.probe import engine_load
from sglang_supervisor.shell.current import Current
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.telemetry.metrics import SupervisorMetrics

if TYPE_CHECKING:
    from sglang_supervisor.shell.engineproc.preflight import Prepared

log = structlog.get_logger("sglang_supervisor")


# What `tune` runs once a trial is ready and probed: (profile, its command (a derived profile's is
# not among the prepared renders), engine URL, its accept length) -> None, or (failure, detail)
# when the profile must not be ranked.
AfterReady = Callable[[str, RenderedCommand, str, float | None], Awaitable[tuple[str, str] | None]]


def tolerance_of(settings: Any) -> F.Tolerance:
    return F.Tolerance(prefix_tokens=settings.prefix_tokens, max_logprob_diff=settings.max_logprob_diff,
                       accept_collapse_ratio=settings.accept_collapse_ratio)


class FidelityChecker:
    def __init__(self, current: Current, lifecycle: Lifecycle, metrics: SupervisorMetrics, *,
                 render: Callable[[str], RenderedCommand], feed: Callable[[Input], None],
                 supervise: Callable[[asyncio.Future[Any]], object]) -> None:
        """`render`: a profile's command (the runner's, derived profiles too); `feed`: a periodic
        check's mismatch to the lifecycle; `supervise`: its task's errors to the TaskGuard."""
        self.current, self.lifecycle, self.metrics = current, lifecycle, metrics
        self.render, self.feed, self.supervise = render, feed, supervise
        self.store = ReferenceStore(current.config.state_dir)
        self.last: dict[str, Any] | None = None  # the last check, for /status
        # The last ready gate's profile and core/canary's word for it (an in-place upgrade's verdict).
        self.at_ready: tuple[str, str] = ("", C.FIDELITY_NOT_CHECKED)
        self.task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.current.config.fidelity.enabled

    def key(self, profile: str) -> str:
        cur = self.current
        return key_for(cur.config.engine.model_path, self.render(profile).argv)

    def reference_profile(self) -> str:
        cur = self.current
        return F.reference_profile(cur.config.profile_names, cur.config.fidelity.reference_profile)

    async def check(self, profile: str, accept: float | None, *, at_ready: bool
                    ) -> FidelityFailed | ProbeFailed | None:
        """One check of the engine serving `profile`: None when it passes (or the reference was
        just taken, or none exists yet for a profile that cannot take it)."""
        cur = self.current
        client = cur.client
        if at_ready:
            self.at_ready = (profile, C.FIDELITY_NOT_CHECKED)
        if not self.enabled or client is None:
            return None
        fs = cur.config.fidelity
        key = self.key(profile)
        ref = self.store.load(key)
        if ref is None and profile != self.reference_profile():
            self._no_reference(profile)  # nothing to judge against, nothing to take: no requests
            return None
        try:
            got = await take_sample(client, cur.base_url, cur.prep.api_key, fs.timeout_s, accept)
        except SampleUnavailable as exc:
            self.metrics.fidelity_check("unavailable")
            log.warning("fidelity.unavailable", profile=profile, problem=exc.problem.value, detail=exc.detail)
            return ProbeFailed(f"fidelity sample: {exc.detail}", hung=exc.timed_out) if at_ready else None
        if ref is None:
            self._take_reference(key, profile, got)
            return None
        secrets = [cur.prep.api_key] if cur.prep.api_key else []
        verdict = F.judge(ref.sample, got, tolerance_of(fs), baseline_accept=ref.accept.get(profile),
                          secrets=secrets)
        self._record(profile, verdict, ref)
        if not verdict.ok:
            return FidelityFailed(verdict.reason, verdict.detail, verdict.prompt, verdict.expected,
                                  verdict.received, at_ready=at_ready)
        if at_ready:
            self.at_ready = (profile, C.FIDELITY_PASSED)
        if accept is not None and accept > 1.0 and profile not in ref.accept:
            self.store.with_accept(ref, profile, accept)  # this profile's own, on these weights
        return None

    def ready_word(self, profile: str) -> str:
        """What the ready gate's check found for `profile`: `pass`, or `not_checked` (disabled,
        no reference yet, the reference just taken: nothing compared)."""
        checked, word = self.at_ready
        return word if checked == profile else C.FIDELITY_NOT_CHECKED

    async def canary_check(self, profile: str, accept: float | None) -> tuple[str, str]:
        """An upgrade candidate's check at its ready gate: (core/canary's fidelity word, what
        differed or why not checked). The reference key is model, tokenizer and dtype, not the
        release: the reference the current release took judges the candidate. A candidate never
        takes a reference (it would judge itself), and a sample it cannot give is tried once
        more, then `unavailable`, which the canary rejects."""
        cur = self.current
        client = cur.client
        if not self.enabled or client is None:
            return C.FIDELITY_NOT_CHECKED, "fidelity is disabled (fidelity.enabled)"
        fs = cur.config.fidelity
        ref = self.store.load(self.key(profile))
        if ref is None:
            self._no_reference(profile)
            return C.FIDELITY_NOT_CHECKED, "no fidelity reference for this model yet"
        problem = ""
        for attempt in (1, 2):
            try:
                got = await take_sample(client, cur.base_url, cur.prep.api_key, fs.timeout_s, accept)
            except SampleUnavailable as exc:
                self.metrics.fidelity_check("unavailable")
                log.warning("fidelity.unavailable", profile=profile, problem=exc.problem.value,
                            detail=exc.detail, canary=True, attempt=attempt)
                problem = exc.detail
                continue
            secrets = [cur.prep.api_key] if cur.prep.api_key else []
            verdict = F.judge(ref.sample, got, tolerance_of(fs), baseline_accept=ref.accept.get(profile),
                              secrets=secrets)
            self._record(profile, verdict, ref)
            if verdict.ok:
                return C.FIDELITY_PASSED, ""
            return C.FIDELITY_FAIL, C.mismatch_detail(verdict.reason, verdict.detail, verdict.prompt,
                                                      verdict.expected, verdict.received)
        return C.FIDELITY_UNAVAILABLE, f"two samples failed, the last: {problem}"[:C.MAX_FIDELITY_DETAIL]

    def _no_reference(self, profile: str) -> None:
        self.metrics.fidelity_check("no_reference")
        self.metrics.fidelity_reference(False)
        log.warning("fidelity.no_reference", profile=profile, reference_profile=self.reference_profile(),
                    hint="the reference is taken when the reference profile reaches READY; "
                         "to take it now: sglang-supervisor fidelity --config CONFIG --reset")

    def _take_reference(self, key: str, profile: str, got: F.Sample) -> None:
        cur = self.current
        rc = self.render(profile)
        ref = Reference(key=key, sample=got, profile=profile, version=cur.prep.version,
                        command_hash=state.command_hash(rc.argv, rc.env),
                        model=cur.config.engine.model_path, dtype=dtype_of(rc.argv),
                        taken_at=time.time(), accept={})
        try:
            self.store.save(ref)
        except OSError as exc:
            log.warning("fidelity.reference_not_saved", profile=profile, error=str(exc)[:200])
            return None
        self.metrics.fidelity_check("reference_taken")
        self.metrics.fidelity_reference(True)
        log.info("fidelity.reference_taken", profile=profile, key=key, sglang_version=cur.prep.version)
        self.last = {"result": "reference_taken", "profile": profile, "at": ref.taken_at}
        return None

    def _record(self, profile: str, verdict: F.Verdict, ref: Reference) -> None:
        stats = dict(verdict.stats)
        self.metrics.fidelity_reference(True)
        self.metrics.fidelity_check("pass" if verdict.ok else "mismatch")
        self.metrics.fidelity_stats(stats.get("min_prefix"), stats.get("logprob_mean_abs_diff"))
        self.last = {"result": "pass" if verdict.ok else "mismatch", "profile": profile,
                     "reason": verdict.reason, "detail": verdict.detail, "prompt": verdict.prompt,
                     "expected": verdict.expected, "received": verdict.received,
                     "stats": stats, "reference_profile": ref.profile, "at": time.time(),
                     "baseline_accept_length": ref.accept.get(profile)}
        log.info("fidelity.check", profile=profile, result=self.last["result"], reason=verdict.reason,
                 **{k: stats.get(k) for k in ("min_prefix", "prefix_agreement", "logprob_mean_abs_diff",
                                              "spec_accept_length")})
        if not verdict.ok:
            with contextlib.suppress(OSError):
                self.store.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                (self.store.dir / "last-mismatch.json").write_text(json.dumps(self.last, indent=1))

    def status(self) -> dict[str, Any]:
        """/status's `fidelity`: enabled, the reference profile, the periodic cost, the last check."""
        fs = self.current.config.fidelity
        return {"enabled": fs.enabled, "reference_profile": self.reference_profile(),
                "interval_s": fs.interval_s,
                "tokens_per_hour": round(F.tokens_per_hour(fs.interval_s), 1),
                "last_check": self.last}

    # -- periodic, while serving ------------------------------------------------------------------

    def start_periodic(self, attempt: int, profile: str) -> None:
        if not self.enabled or self.current.config.fidelity.interval_s <= 0:
            return
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._periodic(attempt, profile))
            self.supervise(self.task)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _periodic(self, attempt: int, profile: str) -> None:
        """Every `fidelity.interval_s`, when nothing runs or waits in the engine (never while it
        is busy: the check would slow users and users would blur the check)."""
        cur = self.current
        while self.lifecycle.attempt == attempt and self.lifecycle.phase in UP_PHASES:
            await asyncio.sleep(cur.config.fidelity.interval_s)
            if self.lifecycle.attempt != attempt or cur.client is None:
                return
            load = await engine_load(cur.client, cur.base_url, cur.prep.api_key)
            if load is None or not load.idle:
                self.metrics.fidelity_check("skipped_busy")
                continue
            result = await self.check(profile, None, at_ready=False)
            if isinstance(result, FidelityFailed) and self.lifecycle.attempt == attempt:
                self.feed(result)
                return


def tune_check(prepared: Prepared) -> AfterReady | None:
    """`tune`'s fidelity check of each ready trial against the stored reference (none: no check)."""
    config = prepared.config
    fs = config.fidelity
    if not fs.enabled:
        return None
    store = ReferenceStore(config.state_dir)

    async def check(name: str, rc: RenderedCommand, base_url: str,
                    accept: float | None) -> tuple[str, str] | None:
        ref = store.load(key_for(config.engine.model_path, rc.argv))
        if ref is None:
            return None
        async with engine_client() as client:
            try:
                got = await take_sample(client, base_url, prepared.api_key, fs.timeout_s, accept)
            except SampleUnavailable as exc:
                return "probe_failed", f"fidelity sample: {exc.detail}"
        verdict = F.judge(ref.sample, got, tolerance_of(fs), baseline_accept=ref.accept.get(name),
                          secrets=[prepared.api_key] if prepared.api_key else [])
        if verdict.ok:
            return None
        where = f" on {verdict.prompt!r}: expected {verdict.expected!r}, got {verdict.received!r}" \
            if verdict.prompt else ""
        return FailureClass.OUTPUT_MISMATCH.value, f"{verdict.detail}{where}"

    return check
