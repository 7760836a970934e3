"""Prometheus metrics of the supervisor, a GPU collector, and the HTTP endpoint that serves them.

Conventions: namespace `sglang_supervisor_`, base units (seconds, bytes, ratios 0..1, watts,
hertz), `_total` only on counters, label values from small sets (free-form strings are capped by
`_BoundedLabel`). The endpoint runs inside the supervisor's asyncio loop (uvicorn.Server as a task)
and never installs signal handlers: the supervisor owns SIGTERM.

Long because: the metric catalogue (every name, type, unit and label set in one place, so
conventions are checked at a glance), the GPU collector that fills part of it and the endpoint that
serves it with /healthz, /status, /readyz and /livez.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Info, generate_latest, make_asgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from sglang_supervisor.core.address import AddressError, parse_address
from sglang_supervisor.core.events import FailureClass
from sglang_supervisor.core.failover import CONFIG_FAILURES
from sglang_supervisor.core.reasons import RestartCause
from sglang_supervisor.core.regression import DECISION_NAMES, Reason
from sglang_supervisor.shell.asgiserver import InLoopServer, listening_socket
from sglang_supervisor.shell.checks.probe import ProbeResult
from sglang_supervisor.shell.telemetry import gpu

log = structlog.get_logger(__name__)

NS = "sglang_supervisor"
DEFAULT_ADDRESS = "127.0.0.1:9400"

# The supervisor's phases (state set). Unknown phases are exported as "other" rather than failing.
STATES: tuple[str, ...] = (
    "starting", "loading", "capturing", "warming", "probing", "ready", "degraded",
    "restarting", "backoff", "stopping", "stopped", "failed", "other",
)
EXPLANATIONS: tuple[str, ...] = tuple(r.value for r in Reason)
# Why the lifecycle can relaunch an engine: failure classes that are retried or fall back (config
# failures end the run instead; temporary ones relaunch once they cleared), a throughput decision,
# a reload. Their series exist from the start at 0, so increase() sees the first restart too.
RESTART_REASONS: tuple[str, ...] = (
    *(c.value for c in FailureClass if c not in CONFIG_FAILURES),
    *(c.value for c in RestartCause),
)


class _BoundedLabel:
    """Maps free-form label values onto at most `limit` distinct values (then "other"), so a bug
    or a hostile string can never explode the series count."""

    _ok = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")

    def __init__(self, limit: int = 32, known: Sequence[str] = ()):
        self._limit = limit
        self._known = frozenset(known)  # always accepted, not counted against the limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen or value in self._known:
            return value
        if not self._ok.match(value) or len(self._seen) >= self._limit:
            return "other"
        self._seen.add(value)
        return value


class GpuCollector(Collector):
    """NVML gauges read at scrape time; no families at all without NVML."""

    def __init__(self, snapshot: Callable[[], list[gpu.GpuInfo] | None] = gpu.snapshot,
                 our_pids: Callable[[], set[int]] | None = None):
        self._snapshot = snapshot
        self._our_pids = our_pids

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gpus = self._snapshot()
        if not gpus:
            return
        labels = ["gpu", "uuid", "name"]

        def family(name: str, doc: str, extra: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{NS}_gpu_{name}", doc, labels=[*labels, *extra])

        used = family("memory_used_bytes", "GPU memory in use")
        total = family("memory_total_bytes", "GPU memory size")
        util = family("utilization_ratio", "share of time a kernel was running (0..1)")
        temp = family("temperature_celsius", "GPU die temperature")
        power = family("power_watts", "GPU power draw")
        limit = family("power_limit_watts", "enforced GPU power limit")
        clock = family("sm_clock_hertz", "SM clock")
        reasons = family("clock_throttle", "1 when this clock-event (throttle) reason is active", ["reason"])
        foreign = family("foreign_processes", "compute processes on this GPU that are not the engine's")
        pids = self._our_pids() if self._our_pids is not None else None
        for g in gpus:
            lv = [str(g.index), g.uuid, g.name]
            for fam, value in ((used, g.memory_used_bytes), (total, g.memory_total_bytes),
                               (util, g.utilization_ratio), (temp, g.temperature_c), (power, g.power_w),
                               (limit, g.power_limit_w), (clock, g.sm_clock_hz)):
                if value is not None:
                    fam.add_metric(lv, float(value))
            for name in (*gpu.CLOCK_REASON_NAMES, "other"):
                reasons.add_metric([*lv, name], 1.0 if name in g.throttle_reasons else 0.0)
            if pids is not None:
                foreign.add_metric(lv, float(sum(1 for p in g.processes if p.pid not in pids)))
        yield from (used, total, util, temp, power, limit, clock, reasons)
        if pids is not None:
            yield foreign


class SupervisorMetrics:
    """The registry and the few methods the supervisor calls. Every method is cheap and never raises
    on odd input (an unknown phase or label value is mapped, not rejected)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, gpu_collector: Collector | None = None,
                 with_gpu: bool = True):
        """Long because: it declares every supervisor metric, one prometheus_client constructor per
        metric with its help text: a table, kept in one place so names, units and labels can be
        reviewed together.
        """
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.state = Enum(f"{NS}_state", "supervisor phase", states=list(STATES), registry=r)
        self.active_profile = Info(f"{NS}_active_profile", "profile the engine runs", registry=r)
        self.fallback_level = Gauge(f"{NS}_fallback_level",
                                    "position of the active profile in the ladder (0 = primary)", registry=r)
        self.below_best = Gauge(f"{NS}_below_best_profile_seconds",
                                "how long this deployment has served below the ladder's best profile, "
                                "across restarts (0 at the best)", registry=r)
        self.engine_up = Gauge(f"{NS}_engine_up", "1 while the engine is ready and serving", registry=r)
        self.code_stale = Gauge(f"{NS}_code_stale", "1 once a package upgrade replaced the installed "
                                "code under this running daemon (restart it to run the new code)", registry=r)
        self.restarts = Counter(f"{NS}_restarts", "engine restarts", ["reason"], registry=r)
        self.reloads = Counter(f"{NS}_config_reloads",
                               "SIGHUP reloads by result (applied, refused, rolled_back)",
                               ["result"], registry=r)
        self.reload_ok = Gauge(f"{NS}_config_last_reload_successful",
                               "0 after a refused or rolled-back reload, until a reload is applied",
                               registry=r)
        for result in ("applied", "refused", "rolled_back"):
            self.reloads.labels(result)
        self.reload_ok.set(1)
        self.upgrade_in_progress = Gauge(f"{NS}_upgrade_in_progress",
                                         "1 while an upgrade canary runs a candidate SGLang release",
                                         registry=r)
        self.upgrade_verdicts = Counter(f"{NS}_upgrade_verdicts",
                                        "upgrade canary verdicts (promoted, rolled_back, refused, "
                                        "in_place_ok, in_place_worse)", ["verdict"], registry=r)
        self.upgrade_tps_ratio = Gauge(f"{NS}_upgrade_tps_ratio",
                                       "the last canary's decode tok/s over the current release's "
                                       "(0: not measured)", registry=r)
        self.internal_errors = Counter(
            f"{NS}_internal_errors",
            "exceptions inside the supervisor (its own faults, never a profile's), kept across restarts",
            registry=r)
        self.start_attempts = Counter(f"{NS}_start_attempts", "engine start attempts",
                                      ["profile", "result"], registry=r)
        self.startup = Gauge(f"{NS}_startup_seconds", "duration of the last successful start", registry=r)
        self.capture = Gauge(f"{NS}_capture_seconds", "CUDA graph capture duration of the last start",
                             ["kind"], registry=r)
        self.probe_tps = Gauge(f"{NS}_probe_output_tokens_per_second",
                               "decode tokens/s of the last successful probe (one stream)", registry=r)
        self.probe_ttft = Gauge(f"{NS}_probe_ttft_seconds", "time to first token of the last probe",
                                registry=r)
        # Two gauges, not a `quantile` label: that label is reserved for summaries.
        self.probe_itl_p50 = Gauge(f"{NS}_probe_inter_token_latency_p50_seconds",
                                   "median gap between streamed chunks in the last probe", registry=r)
        self.probe_itl_p90 = Gauge(f"{NS}_probe_inter_token_latency_p90_seconds",
                                   "90th percentile chunk gap in the last probe", registry=r)
        self.probe_e2e = Gauge(f"{NS}_probe_e2e_seconds", "end-to-end seconds of the last probe", registry=r)
        self.probe_accept = Gauge(f"{NS}_probe_spec_accept_length",
                                  "speculative accept length of the last probe", registry=r)
        self.probe_runs = Counter(f"{NS}_probe_runs", "probes by result", ["result"], registry=r)
        # Output fidelity (core/fidelity.py): checks by result (pass, mismatch, unavailable,
        # no_reference, reference_taken, skipped_busy) and the statistic of the last check.
        self.baseline_accept = Gauge(f"{NS}_baseline_spec_accept_length",
                                     "speculative accept length of this start's baseline probes", registry=r)
        self.fidelity_checks = Counter(f"{NS}_fidelity_checks", "output-fidelity checks by result",
                                       ["result"], registry=r)
        self.fidelity_has_reference = Gauge(f"{NS}_fidelity_reference",
                                            "1 when the model has a fidelity reference", registry=r)
        self.fidelity_prefix = Gauge(f"{NS}_fidelity_min_prefix_tokens",
                                     "greedy tokens agreeing with the reference, worst prompt, last check",
                                     registry=r)
        self.fidelity_logprob = Gauge(f"{NS}_fidelity_logprob_mean_abs_diff",
                                      "teacher-forced mean absolute log-prob difference, last check (nats)",
                                      registry=r)
        self.fidelity_mismatch = Gauge(f"{NS}_fidelity_last_mismatch_timestamp_seconds",
                                       "when the last output mismatch was seen (0: never)", registry=r)
        self.last_probe = Gauge(f"{NS}_last_probe_timestamp_seconds", "when the last probe started",
                                registry=r)
        self.baseline = Gauge(f"{NS}_baseline_output_tokens_per_second",
                              "baseline decode tokens/s for the active fingerprint", registry=r)
        # The number /status shows as throughput.ratio and the regression policy acts on.
        self.ratio = Gauge(f"{NS}_throughput_ratio",
                           "median probe tokens/s of the regression window over the baseline", registry=r)
        self.passive = Gauge(f"{NS}_passive_output_tokens_per_second",
                             "engine-reported generation throughput while serving traffic", registry=r)
        self.probe_tokens = Counter(f"{NS}_probe_tokens", "tokens the probes generated and read", registry=r)
        self.probe_gpu_seconds = Counter(f"{NS}_probe_gpu_seconds", "GPU time the probes used", registry=r)
        self.decisions = Counter(f"{NS}_regression_decisions", "regression policy decisions", ["decision"],
                                 registry=r)
        self.explained = Gauge(f"{NS}_slowdown_explanation",
                               "1 while this explanation holds for the current slowdown", ["reason"],
                               registry=r)
        for reason in EXPLANATIONS:
            self.explained.labels(reason).set(0)
        for result in ("ok", "failed"):
            self.probe_runs.labels(result)
        for name in DECISION_NAMES:  # zero series exist from the start, so increase() sees the first one
            if name != "no_action":
                self.decisions.labels(name)
        for reason in RESTART_REASONS:
            self.restarts.labels(reason)
        self.engine_log_writable = Gauge(
            f"{NS}_engine_log_writable",
            "0 while writes to the engine log file fail (disk full, quota, directory gone)",
            registry=r)
        self.engine_log_write_failures = Counter(
            f"{NS}_engine_log_write_failures",
            "spells of failed writes to the engine log file", registry=r)
        self.engine_log_dropped = Counter(
            f"{NS}_engine_log_dropped_bytes", "engine output not written to the engine log file",
            registry=r)
        self.engine_log_writable.set(1)
        self._reason_label = _BoundedLabel(known=RESTART_REASONS)
        self._profile_label = _BoundedLabel()
        self._result_label = _BoundedLabel()
        self._kind_label = _BoundedLabel()
        self._decision_label = _BoundedLabel()
        self._baseline: float | None = None
        # NaN until known: comparisons with NaN are false, so no alert fires before the first probe.
        self.baseline.set(float("nan"))
        self.ratio.set(float("nan"))
        self.state.state("starting")
        if with_gpu:
            r.register(gpu_collector or GpuCollector())

    # --- what CORE calls ---------------------------------------------------------------------

    def reload_result(self, result: str) -> None:
        """`applied`, `refused` (a reload that would not apply every changed key, or whose file
        fails the checks) or `rolled_back` (its command failed before READY; the previous one
        serves again)."""
        label = result if result in ("refused", "rolled_back") else "applied"
        self.reloads.labels(label).inc()
        self.reload_ok.set(1 if label == "applied" else 0)

    def set_upgrade(self, state: str, version: str, tps_ratio: float | None = None) -> None:
        """An upgrade canary began (`in_progress`), or its verdict (the counter's label)."""
        self.upgrade_in_progress.set(1 if state in ("in_progress", "in_place") else 0)
        if state not in ("in_progress", "in_place"):
            self.upgrade_verdicts.labels(state).inc()
            self.upgrade_tps_ratio.set(tps_ratio or 0.0)

    def set_state(self, phase: str) -> None:
        """Current supervisor phase, one of STATES (others are shown as "other")."""
        self.state.state(phase if phase in STATES else "other")

    def set_active_profile(self, profile: str, engine_version: str, config_hash: str,
                           fallback_level: int = 0) -> None:
        self.active_profile.info({"profile": profile, "engine_version": engine_version,
                                  "config_hash": config_hash})
        self.fallback_level.set(fallback_level)

    def set_engine_up(self, up: bool) -> None:
        self.engine_up.set(1 if up else 0)

    def restart(self, reason: str) -> None:
        """One engine restart; `reason` is one of RESTART_REASONS (anything else is bounded)."""
        self.restarts.labels(self._reason_label(reason)).inc()

    def start_attempt(self, profile: str, result: str) -> None:
        """`result`: "ready" or the FailureClass value of why the start failed."""
        self.start_attempts.labels(self._profile_label(profile), self._result_label(result)).inc()

    def startup_seconds(self, seconds: float) -> None:
        self.startup.set(seconds)

    def capture_seconds(self, kind: str, seconds: float) -> None:
        """`kind` like "target_decode", "target_prefill", "draft_extend"."""
        self.capture.labels(self._kind_label(kind)).set(seconds)

    def observe_probe(self, result: ProbeResult) -> None:
        self.probe_runs.labels("ok" if result.ok else "failed").inc()
        self.last_probe.set(result.started_at)
        if not result.ok or result.decode_tps is None:
            return
        self.probe_tps.set(result.decode_tps)
        for attr, gauge in ((result.ttft_s, self.probe_ttft), (result.e2e_s, self.probe_e2e),
                            (result.spec_accept_length, self.probe_accept),
                            (result.itl_p50_s, self.probe_itl_p50), (result.itl_p90_s, self.probe_itl_p90)):
            if attr is not None:
                gauge.set(attr)

    def set_baseline_accept(self, value: float) -> None:
        self.baseline_accept.set(value)

    def fidelity_check(self, result: str) -> None:
        self.fidelity_checks.labels(result).inc()
        if result == "mismatch":
            self.fidelity_mismatch.set(time.time())

    def fidelity_reference(self, present: bool) -> None:
        self.fidelity_has_reference.set(1 if present else 0)

    def fidelity_stats(self, min_prefix: object, logprob_diff: object) -> None:
        for value, gauge in ((min_prefix, self.fidelity_prefix), (logprob_diff, self.fidelity_logprob)):
            gauge.set(float(value) if isinstance(value, int | float) else float("nan"))

    def set_ratio(self, ratio: float | None) -> None:
        """The regression policy's ratio (median of the window / baseline), as /status reports it;
        NaN while unknown."""
        self.ratio.set(float("nan") if ratio is None else ratio)

    def set_baseline(self, tps: float | None) -> None:
        self._baseline = tps
        self.baseline.set(tps if tps is not None else float("nan"))

    def set_passive_tps(self, tps: float) -> None:
        self.passive.set(tps)

    def probe_cost(self, tokens: int, gpu_seconds: float) -> None:
        """What probing cost: tokens processed (prompt + generated) and GPU seconds occupied."""
        if tokens:
            self.probe_tokens.inc(tokens)
        if gpu_seconds > 0:
            self.probe_gpu_seconds.inc(gpu_seconds)

    def decision(self, name: str, explanations: Sequence[str] = ()) -> None:
        """A regression decision (regression.decision_name) and the explanations now holding."""
        self.decisions.labels(self._decision_label(name)).inc()
        self.set_explanations(explanations)

    def set_explanations(self, reasons: Sequence[str]) -> None:
        for reason in EXPLANATIONS:
            self.explained.labels(reason).set(1 if reason in reasons else 0)

    def engine_log_state(self, writable: bool, dropped_bytes: int = 0, *, began: bool = False
                         ) -> None:
        """The engine log file's health: writable or not, bytes it lost, a spell that began."""
        self.engine_log_writable.set(1 if writable else 0)
        if began:
            self.engine_log_write_failures.inc()
        if dropped_bytes > 0:
            self.engine_log_dropped.inc(dropped_bytes)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServerError(RuntimeError):
    pass


class _AsgiEndpoint:
    """Starlette treats a plain function as request→response; an object is called as ASGI."""

    def __init__(self, app: Callable[..., Any]):
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


def _json_default(value: object) -> object:
    return str(value)


class _Verdict(Protocol):
    @property
    def ready(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class MetricsServer:
    """`/metrics`, `/healthz` and `/status` (JSON from `status_provider`) on one loopback port;
    `/readyz` and `/livez` for load balancers and Kubernetes probes (docs/OPERATIONS.md)."""

    def __init__(self, address: str, metrics: SupervisorMetrics,
                 status_provider: Callable[[], Mapping[str, Any]] | None = None, *,
                 readiness: Callable[[], _Verdict] | None = None,
                 liveness: Callable[[], _Verdict] | None = None):
        try:
            self.host, self.port = parse_address(address)
        except AddressError as exc:
            raise MetricsServerError(f"metrics address: {exc}") from None
        self.metrics = metrics
        self._status = status_provider or (lambda: {})
        self._readiness = readiness
        self._liveness = liveness
        self._server = InLoopServer("metrics-server", graceful_shutdown_s=2, stop_wait_s=5.0)
        self._started_at = time.time()

    def app(self) -> Starlette:
        async def healthz(_: Request) -> Response:
            return PlainTextResponse("ok\n")

        async def status(_: Request) -> Response:
            try:
                body = dict(self._status())
            except Exception as exc:  # a broken provider must not take the endpoint down
                return JSONResponse({"error": f"status unavailable: {type(exc).__name__}"}, status_code=500)
            return Response(json.dumps(body, default=_json_default), media_type="application/json")

        def verdict(provider: Callable[[], _Verdict] | None, what: str) -> Response:
            if provider is None:
                return JSONResponse({what: False, "reason": "not wired"}, status_code=503)
            try:
                v = provider()
            except Exception as exc:  # a broken provider says "no", it does not take the endpoint down
                return JSONResponse({what: False, "reason": f"unavailable: {type(exc).__name__}"},
                                    status_code=503)
            return JSONResponse({what: v.ready, "reason": v.reason}, status_code=200 if v.ready else 503)

        async def readyz(_: Request) -> Response:
            return verdict(self._readiness, "ready")

        async def livez(_: Request) -> Response:
            return verdict(self._liveness, "alive")

        return Starlette(routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/livez", livez),
            Route("/status", status),
            # An exact route (a Mount would redirect /metrics to /metrics/).
            Route("/metrics", _AsgiEndpoint(make_asgi_app(self.metrics.registry))),
        ])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve. Raises MetricsServerError (port taken, bad address); the caller logs it
        and runs on without metrics."""
        try:
            sock = listening_socket(self.host, self.port, 128, nodelay=True)
        except OSError as exc:
            raise MetricsServerError(
                f"cannot listen on {self.host}:{self.port} for metrics: {exc.strerror or exc}; "
                "set metrics.address to a free HOST:PORT"
            ) from None
        self.port = sock.getsockname()[1]
        def failed(failure: BaseException | None) -> MetricsServerError:
            return MetricsServerError(f"metrics server failed to start: {failure!r}")

        await self._server.start(self.app(), sock, failed)
        log.info("metrics.listening", url=self.url)

    async def stop(self) -> None:
        await self._server.stop()
