"""`sglang-supervisor doctor`: host, engine, audit and live findings for a configuration.

This is the imperative shell around `audit` (pure rules): it reads the config, the model's
config.json, NVML, /dev/shm, rlimits, ports and directories, asks the engine's interpreter for its
sglang version and runs the real SGLang argument parser there (`engine/argcheck.py`, a short
subprocess), asks the running unit's /status whether it runs code older than the installed
package, then optionally reads a running server's /server_info and /metrics.

Exit status: 0 when no finding is an error, 1 otherwise (warnings do not fail it).

Long because: it is the subcommand's imperative shell, every read it makes in one place: the host
(ports and who holds them, NVML, /dev/shm, rlimits, directories, the model), the engine's version
and a live server (/server_info, /metrics, the supervisor's /status), behind module-level functions
that tests replace (port_busy, port_holder, live_report, supervisor_status, HTTP_TIMEOUT_S). The
rules (core/audit/), the engine side (profilecheck.py), the unit's view (unitcheck.py) and the
report (doctorreport.py) are elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import structlog

from sglang_supervisor.commands import profilecheck, unitcheck
from sglang_supervisor.commands.doctorreport import Report, format_human
from sglang_supervisor.commands.profilecheck import run_argcheck
from sglang_supervisor.core import audit
from sglang_supervisor.core.address import parse_address
from sglang_supervisor.core.audit import Finding, HostFacts
from sglang_supervisor.core.config import Config, ConfigError, effective_overlay
from sglang_supervisor.engine.api import (
    METRICS_ROUTE,
    MODEL_INFO_ROUTE,
    SERVER_INFO_ROUTES,
    parse_engine_metrics,
)
from sglang_supervisor.engine.detect import detect_engine_version, engine_interpreter, is_simulator
from sglang_supervisor.engine.modelinfo import ModelInfo, ModelInfoError, looks_like_hub_id, read_model_dir
from sglang_supervisor.engine.sglang import known_versions
from sglang_supervisor.shell import upgrades
from sglang_supervisor.shell.checks.enginehttp import (
    MAX_METRICS_BYTES,
    EngineAnswerError,
    fetch_sync,
    parse_json,
)
from sglang_supervisor.shell.engineproc import ports
from sglang_supervisor.shell.files import state
from sglang_supervisor.shell.files.configfile import load_config
from sglang_supervisor.shell.files.state import remembered_derived
from sglang_supervisor.shell.telemetry import gpu

VERSION_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 2.0  # the local /status without --url: a hung unit must not stall doctor
PORT_PROBE_TIMEOUT_S = 2.0  # a busy port's listener asked "are you SGLang?"


# --------------------------------------------------------------------------------------------
# Host facts
# --------------------------------------------------------------------------------------------


def port_busy(host: str, port: int) -> bool:
    return ports.bind_error(host, port) is not None


def sglang_model_info(base_url: str, api_key: str | None,
                      timeout_s: float = PORT_PROBE_TIMEOUT_S) -> dict[str, Any] | None:
    """SGLang's /model_info at base_url, or None when what answers there (if anything) is not SGLang."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client() as http:
            answer = fetch_sync(http, base_url + MODEL_INFO_ROUTE, deadline_s=timeout_s, headers=headers)
        data = parse_json(answer.body, what=MODEL_INFO_ROUTE) if answer.status == 200 else None
    except EngineAnswerError:
        return None
    if isinstance(data, dict) and "model_path" in data and "is_generation" in data:
        return data
    return None


def _pids_text(pids: Sequence[int]) -> str:
    if not pids:
        return "pid unknown: not readable by this user"
    return "pid " + ", ".join(str(p) for p in pids)


def port_holder(config: Config, port: int, api_key: str | None) -> str | None:
    """Who holds a busy port, when it is a running SGLang or sglang-supervisor (probably ours), or
    None for anything else. An engine answering /model_info is named with its pid and whether a
    supervisor started it."""
    pids = sorted(ports.listener_pids(port))
    supervisors = [p for p in pids if ports.is_supervisor_run(ports.cmdline(p))]
    if supervisors:
        return f"held by a running sglang-supervisor ({_pids_text(supervisors)})"
    info = sglang_model_info(ports.local_base_url(config.engine.host, port), api_key)
    if info is None:
        return None
    model = str(info.get("model_path"))
    whose = ("the configured model" if model == config.engine.model_path
             else f"not the configured model: {model}")
    parents = sorted({s for p in pids if (s := ports.supervisor_above(p)) is not None})
    if parents:
        started = f"started by sglang-supervisor {_pids_text(parents)}"
    elif pids:
        started = "not started by a sglang-supervisor"
    else:
        started = "starter unknown"
    return f"SGLang already running ({_pids_text(pids)}, {whose}, {started})"


def _api_key_or_none(config: Config) -> str | None:
    from sglang_supervisor.shell.engineproc.apikey import read_api_key  # noqa: PLC0415 (doctor's only other use is --url)

    try:
        return read_api_key(config.engine)
    except ConfigError:
        return None


def dir_status(path: str) -> str:
    p = Path(path)
    if not p.exists():
        return "missing"
    if not p.is_dir():
        return "unwritable: not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"unwritable: permission denied for uid {os.getuid()}"
    return "ok"


def shm_size(path: str = "/dev/shm") -> int | None:  # noqa: S108 (reading its size)
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def memlock_soft() -> int | None:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (OSError, ValueError):
        return None
    return -1 if soft == resource.RLIM_INFINITY else soft


def _visible_gpus(gpus: list[gpu.GpuInfo], env: Mapping[str, str]) -> list[gpu.GpuInfo]:
    """Honour CUDA_VISIBLE_DEVICES (indices or UUIDs) the way CUDA numbers the GPUs."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    out: list[gpu.GpuInfo] = []
    for token in (t.strip() for t in visible.split(",") if t.strip()):
        match = [g for g in gpus if str(g.index) == token or g.uuid.startswith(token)]
        out.extend(match[:1])
    return out


def gpu_process_lines(gpus: Sequence[gpu.GpuInfo], ours: Mapping[int, str],
                      title: Callable[[int], str] | None = None) -> tuple[list[str], list[str]]:
    """GPU compute processes, (the running engine's, everybody else's): "our engine (pid 31,
    sglang::scheduler_TP0) on GPU0, 70.0 GiB" and "GPU0 pid 123 (python3 train.py) 40.0 GiB".
    `ours`: pid -> title of the engine's processes."""
    title = title or ports.process_title
    engine: list[str] = []
    others: list[str] = []
    for p in gpu.find_foreign(gpus, set()):
        size = f" {p.used_bytes / 1024**3:.1f} GiB" if p.used_bytes else ""
        if p.pid in ours:
            engine.append(f"our engine (pid {p.pid}, {ours[p.pid]}) on GPU{p.gpu_index}" + (
                f",{size}" if size else ""))
        else:
            others.append(f"GPU{p.gpu_index} pid {p.pid} ({title(p.pid)}){size}")
    return engine, others


def _tp_link(nvml: gpu.Nvml, gpus: Sequence[gpu.GpuInfo], tp_size: int) -> gpu.P2PLink | None:
    """The slowest link between the first GPU and the other TP GPUs (it bounds the allreduce)."""
    if len(gpus) < 2 or tp_size < 2:
        return None
    order: list[gpu.P2PLink] = ["none", "unknown", "pcie-p2p", "nvlink"]
    ranks = [order.index(nvml.p2p_link(gpus[0].index, g.index)) for g in gpus[1:tp_size]]
    return order[min(ranks)]


def _port_facts(
    config: Config, extra_ports: Mapping[int, str]
) -> tuple[dict[int, str], dict[int, str], dict[int, str]]:
    """The ports this configuration binds (port -> what for), those already taken, and of those the
    ones a running SGLang or supervisor holds (port -> who)."""
    checked = {config.engine.port: "engine HTTP"}
    if config.metrics.enabled:
        checked.setdefault(parse_address(config.metrics.address)[1], "supervisor metrics")  # validated
    checked.update({p: w for p, w in extra_ports.items() if p not in checked})
    checked = {p: w for p, w in checked.items() if p}
    busy = {p: w for p, w in checked.items() if port_busy(config.engine.host, p)}
    api_key = _api_key_or_none(config) if busy else None
    running = {p: h for p in busy if (h := port_holder(config, p, api_key)) is not None}
    return checked, busy, running


def _dir_facts(config: Config, env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """path -> (what it is for, its status) for every directory the engine or supervisor writes."""
    log_dir = str(Path(config.engine.log_file).parent)
    dirs: dict[str, tuple[str, str]] = {
        config.state_dir: ("state directory", dir_status(config.state_dir)),
        log_dir: ("engine log directory", dir_status(log_dir)),
    }
    if config.runtime_dir:
        dirs[config.runtime_dir] = ("runtime directory", dir_status(config.runtime_dir))
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".cache")
    dirs.setdefault(cache, ("kernel/JIT cache directory", dir_status(cache)))
    if config.engine.cache_dir:  # else the unit's CacheDirectory, which systemd makes writable
        dirs.setdefault(config.engine.cache_dir,
                        ("engine.cache_dir (kernel caches)", dir_status(config.engine.cache_dir)))
    return dirs


def _model_facts(config: Config) -> tuple[ModelInfo | None, str | None]:
    try:
        return read_model_dir(config.engine.model_path), None
    except ModelInfoError as e:
        # a Hugging Face id is valid (CONFIG.md): SGLang downloads it at the first start
        return None, None if looks_like_hub_id(config.engine.model_path) else str(e)


def gather_host(
    config: Config, extra_ports: Mapping[int, str], tp_size: int, env: Mapping[str, str]
) -> tuple[HostFacts, dict[str, Any]]:
    nvml = gpu.default()
    snap = nvml.snapshot() if nvml.available() else None
    gpus = _visible_gpus(snap, env) if snap is not None else []
    link = _tp_link(nvml, gpus, tp_size)
    checked, busy, running = _port_facts(config, extra_ports)
    # A running engine on our port holds its GPUs: its processes are ours, not foreign.
    ours = ports.server_processes(config.engine.port) if config.engine.port in running else {}
    engine_gpu, foreign = gpu_process_lines(gpus, ours)
    dirs = _dir_facts(config, env)
    model, model_error = _model_facts(config)
    facts = HostFacts(
        nvml=snap is not None,
        gpus=tuple(gpus),
        foreign=tuple(foreign),
        engine_gpu=tuple(engine_gpu),
        engine_gpu_bytes={g.index: gpu.held_by([g], ours) for g in gpus},
        tp_link=link,
        shm_bytes=shm_size(),
        memlock_soft=memlock_soft(),
        ports_busy=busy,
        ports_running=running,
        ports_checked=checked,
        dirs=dirs,
        model=model,
        model_error=model_error,
    )
    return facts, _host_summary(facts)


def _host_summary(facts: HostFacts) -> dict[str, Any]:
    """The host facts as doctor's JSON shows them."""
    return {
        "nvml": facts.nvml,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "compute_capability": g.compute_capability,
                "driver": g.driver,
                "memory_total_bytes": g.memory_total_bytes,
                "memory_used_bytes": g.memory_used_bytes,
            }
            for g in facts.gpus
        ],
        "foreign_processes": list(facts.foreign),
        "engine_gpu_processes": list(facts.engine_gpu),
        "tp_link": facts.tp_link,
        "shm_bytes": facts.shm_bytes,
        "memlock_soft": facts.memlock_soft,
        "ports": {str(p): ("running" if p in facts.ports_running
                           else "busy" if p in facts.ports_busy else "free")
                  for p in sorted(facts.ports_checked)},
        "dirs": {path: status for path, (_, status) in sorted(facts.dirs.items())},
        "model": facts.model.to_dict() if facts.model else None,
        "model_error": facts.model_error,
    }


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _engine_version(config: Config, environ: Mapping[str, str], interpreter: str) -> tuple[str, str, Finding]:
    """The SGLang version to audit for, where it comes from (config, detected, assumed), and the
    finding that says so."""
    version_source = "config" if config.engine.version != "auto" else "detected"
    try:
        version = detect_engine_version(config, VERSION_TIMEOUT_S, environ=environ)
    except ConfigError as e:
        version = known_versions()[-1]
        return version, "assumed", Finding(
            "warning",
            "engine",
            f"the installed sglang version is unknown; auditing for {version}",
            "; ".join(p.problem for p in e.problems),
            "; ".join(p.fix for p in e.problems),
            "engine.version",
        )
    return version, version_source, Finding(
        "info",
        "engine",
        f"sglang {version} ({version_source})",
        f"interpreter {interpreter}",
        "",
        "engine.version",
    )


def config_report(
    config: Config,
    report: Report,
    *,
    real_parser: bool = True,
    runner: Callable[..., tuple[dict[str, Any] | None, str | None]] = run_argcheck,
    environ: Mapping[str, str] | None = None,
) -> None:
    """`environ`: the supervisor's environment (default ours), which the engine inherits."""
    environ = dict(os.environ) if environ is None else environ
    interpreter = engine_interpreter(config)
    version, version_source, finding = _engine_version(config, environ, interpreter)
    report.findings.append(finding)
    report.engine.update({"interpreter": interpreter, "version": version, "version_source": version_source})
    overlay_tp = max(
        int(str(effective_overlay(config, p.name)[0].get("tp-size") or 1)) for p in config.profiles
    )
    env = {**environ, **config.engine.env}
    host, host_summary = gather_host(config, profilecheck.encoder_ports(config, version), overlay_tp, env)
    report.host.update(host_summary)
    mem = config.engine.args.get("mem-fraction-static")
    mem_fraction = float(mem) if isinstance(mem, int | float) and not isinstance(mem, bool) else None
    report.findings += audit.host_findings(host, overlay_tp, mem_fraction)
    if host.model is None and looks_like_hub_id(config.engine.model_path):
        report.findings.append(Finding(
            "info", "host", f"engine.model_path {config.engine.model_path} is a Hugging Face id",
            "SGLang downloads it into HF_HOME at the first start (/var/cache/sglang-supervisor/huggingface "
            "under the unit); model checks need its config.json",
            "to audit the model now: download it (huggingface-cli download ID) and point "
            "engine.model_path at the directory", "host.model"))
    profilecheck.profile_findings(
        config,
        version,
        interpreter=interpreter,
        real_parser=real_parser and not is_simulator(config),
        report=report,
        runner=runner,
        model=host.model,
        host=host,
        environ=environ,
    )


def derived_findings(config: Config, report: Report) -> None:
    """The derived profiles the state file remembers (issue 25): `run` may start one first, so
    the operator sees what it is, where it came from and why; `forget` drops it."""
    if config.group is not None:
        return  # a group never derives
    derived = remembered_derived(config.state_dir, config.name, config.profile_names)
    if not derived:
        return
    report.engine["derived_profiles"] = {n: d.to_json() for n, d in derived.items()}
    for name, d in derived.items():
        report.findings.append(Finding(
            "info", "engine", f"derived profile {name} is remembered: {d.base} with {d.change}",
            f"it served after {d.base} failed ({d.asked_by[:160]}); run may start it before {d.base}",
            f"sglang-supervisor forget --profile {name} drops it (render --profile {name} shows "
            "its command)", "derived.remembered", profile=name))


# --------------------------------------------------------------------------------------------
# Live
# --------------------------------------------------------------------------------------------


def supervisor_status(address: str, timeout_s: float = HTTP_TIMEOUT_S) -> Any:
    """The running supervisor's /status at metrics.address, or None (not running, not JSON)."""
    host, port = parse_address(address)
    try:
        resp = httpx.get(f"{ports.local_base_url(host, port)}/status", timeout=timeout_s)
        if resp.status_code != 200 or len(resp.content) > 1_000_000:
            return None
        return resp.json()
    except (httpx.HTTPError, OSError, ValueError):
        return None


def live_report(url: str, report: Report, api_key: str | None, client: httpx.Client | None = None) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    own = client is None
    http = client or httpx.Client(timeout=HTTP_TIMEOUT_S)
    try:
        info: Any = None
        error = "no answer"
        for path in SERVER_INFO_ROUTES:
            try:
                resp = fetch_sync(http, url.rstrip("/") + path, deadline_s=HTTP_TIMEOUT_S, headers=headers)
            except EngineAnswerError as e:
                error = f"{path}: {e}"
                break
            if resp.status == 404:
                error = f"{path}: 404"
                continue
            if resp.status != 200:
                error = f"{path}: HTTP {resp.status}" + (
                    " (set the API key)" if resp.status == 401 else ""
                )
                break
            try:
                info = parse_json(resp.body, what=path)
            except EngineAnswerError as e:
                error = f"{path}: {e}"
            break
        if not isinstance(info, dict):
            report.findings.append(
                Finding(
                    "error",
                    "live",
                    f"cannot read {url}{SERVER_INFO_ROUTES[0]}",
                    error,
                    "check --url (and that the engine is up)",
                    "live.unreachable",
                )
            )
            report.live = {"url": url, "error": error}
            return
        decode_none: float | None = None
        try:
            m = fetch_sync(http, url.rstrip("/") + METRICS_ROUTE, deadline_s=HTTP_TIMEOUT_S,
                           max_bytes=MAX_METRICS_BYTES, headers=headers)
            if m.status == 200:
                decode_none = parse_engine_metrics(m.text()).decode_eager_passes
        except (EngineAnswerError, ValueError):
            decode_none = None
        report.findings += audit.live_findings(info, decode_none)
        redacted = audit.redact_server_info(info)
        report.live = {
            "url": url,
            "summary": audit.redact_server_info(audit.live_summary(info)),
            "resolved_args": {k: v for k, v in redacted.items() if k != "internal_states"},
            "decode_none_passes": decode_none,
        }
    finally:
        if own:
            http.close()


def quiet_logging() -> None:
    """NVML and config warnings are findings here; keep stdout for the report."""
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(40),
    )


def _load_config(config_path: str, report: Report) -> Config | None:
    """The configuration, its warnings and problems as findings; None when it does not load."""
    try:
        return load_config(
            config_path,
            on_warning=lambda p: report.findings.append(
                Finding(
                    "warning",
                    "engine",
                    f"{p.path}: {p.problem}",
                    "configuration file check",
                    p.fix,
                    "config.warning",
                )
            ),
        )
    except ConfigError as e:
        for p in e.problems:
            report.findings.append(
                Finding(
                    "error",
                    "engine",
                    f"{p.path or config_path}: {p.problem}",
                    f"configuration {config_path}",
                    p.fix,
                    "config.invalid",
                )
            )
        return None


def _live(url: str, config: Config | None, report: Report) -> None:
    """`--url`: the running server's evidence, and the supervisor's fallback when it has /status."""
    api_key: str | None = None
    if config is not None:
        try:
            from sglang_supervisor.shell.engineproc.apikey import read_api_key  # noqa: PLC0415 (only for --url)

            api_key = read_api_key(config.engine)
        except ConfigError:
            api_key = os.environ.get("SGLANG_API_KEY")
    else:
        api_key = os.environ.get("SGLANG_API_KEY")
    live_report(url, report, api_key)
    if config is not None and config.metrics.enabled:
        status = supervisor_status(config.metrics.address)
        report.findings += audit.fallback_findings(status, config.profile_names)
        report.findings += audit.fidelity_findings(status)
        report.findings += audit.code_stale_findings(status, _unit_name(config, report))
        if isinstance(status, dict) and report.live is not None:
            report.live["supervisor_profile"] = status.get("profile")


def build_report(args: argparse.Namespace) -> Report:
    report = Report()
    config: Config | None = None
    config_path = getattr(args, "config", None)
    if config_path and (Path(config_path).exists() or not args.url):
        config = _load_config(config_path, report)
    if config is not None:
        report.engine["config"] = str(config_path)
        try:
            config_report(config, report)
            derived_findings(config, report)
            unit = unitcheck.unit_view(config, str(config_path))
            if unit is not None:
                report.findings += unit[0]
                report.host["unit"] = unit[1]
            report.findings = audit.collapse_common(report.findings, config.profile_names)
            report.findings += audit.release_findings(upgrades.load(state.releases_path(config)),
                                                      config.engine.candidate.python)
        except ConfigError as e:  # e.g. a profile whose `extends` chain cannot render
            for p in e.problems:
                report.findings.append(
                    Finding("error", "engine", f"{p.path}: {p.problem}", "rendering", p.fix, "config.render")
                )
    if args.url:
        _live(args.url, config, report)
    elif config is not None and config.metrics.enabled:
        # Without --url the running unit is still asked whether it runs code older than the
        # installed package (issue 28.3): nothing else says that an upgrade is not in effect.
        status = supervisor_status(config.metrics.address, timeout_s=STATUS_TIMEOUT_S)
        report.findings += audit.code_stale_findings(status, _unit_name(config, report))
    return report


def _unit_name(config: Config, report: Report) -> str:
    """The unit that runs this configuration, as the unit check found it, else the template's."""
    unit = report.host.get("unit")
    name = unit.get("unit") if isinstance(unit, dict) else None
    return name if isinstance(name, str) and name else f"sglang-supervisor@{config.name}.service"


def main(args: argparse.Namespace) -> int:
    quiet_logging()
    report = build_report(args)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=False, default=str))
    else:
        print(format_human(report))
    return 1 if audit.has_errors(report.findings) else 0
