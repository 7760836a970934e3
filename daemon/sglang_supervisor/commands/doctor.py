"""`sglang-supervisor doctor`: host, engine, audit and live findings for a configuration.

This is the imperative shell around `audit` (pure rules): it reads the config, the model's
config.json, NVML, /dev/shm, rlimits, ports and directories, asks the engine's interpreter for its
sglang version and runs the real SGLang argument parser there (`engine/argcheck.py`, a short
subprocess), then optionally reads a running server's /server_info and /metrics.

Exit status: 0 when no finding is an error, 1 otherwise (warnings do not fail it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog

from sglang_supervisor.core import audit, profiles, unitview
from sglang_supervisor.core.address import parse_address
from sglang_supervisor.core.audit import Finding, HostFacts, ProfileView
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import Config, ConfigError, effective_overlay
from sglang_supervisor.engine.api import (
    METRICS_ROUTE,
    MODEL_INFO_ROUTE,
    SERVER_INFO_ROUTES,
    parse_engine_metrics,
)
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.detect import detect_engine_version, engine_interpreter, is_simulator
from sglang_supervisor.engine.modelinfo import ModelInfo, ModelInfoError, looks_like_hub_id, read_model_dir
from sglang_supervisor.engine.sglang import ENCODER_BOOTSTRAP_PORT_DEFAULT, flag_catalog, known_versions
from sglang_supervisor.shell import gpu, ports
from sglang_supervisor.shell.configfile import load_config
from sglang_supervisor.shell.enginehttp import MAX_METRICS_BYTES, EngineAnswerError, fetch_sync, parse_json

ARGCHECK_SCRIPT = Path(__file__).resolve().parent.parent / "engine" / "argcheck.py"
ARGCHECK_TIMEOUT_S = 120.0
VERSION_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
PORT_PROBE_TIMEOUT_S = 2.0  # a busy port's listener asked "are you SGLang?"
_MARK = {"error": "ERROR", "warning": "WARN ", "info": "info ", "ok": "ok   "}
_AREA_TITLE = {"host": "Host", "engine": "Engine", "audit": "Audit", "live": "Live server"}


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    live: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "findings": [f.to_dict() for f in audit.sort_findings(self.findings)],
            "host": self.host,
            "engine": self.engine,
        }
        if self.live is not None:
            out["live"] = self.live
        out["errors"] = sum(1 for f in self.findings if f.severity == "error")
        return out


# --------------------------------------------------------------------------------------------
# Engine: version and the real parser
# --------------------------------------------------------------------------------------------


def run_argcheck(
    interpreter: str,
    argvs: Mapping[str, Sequence[str]],
    *,
    list_options: bool = False,
    timeout_s: float = ARGCHECK_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """Run `engine/argcheck.py` with `interpreter`: (its JSON answer, None) or (None, why not).

    `env`: the environment the engine itself gets (default: ours without systemd's variables).
    PYTHONPATH stays: where sglang is importable only through it, the engine imports it so too."""
    request = json.dumps({"argvs": {k: list(v) for k, v in argvs.items()}, "list_options": list_options})
    env = engine_env(os.environ if env is None else env, {})
    try:
        proc = subprocess.run(
            [interpreter, str(ARGCHECK_SCRIPT)],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=env,
        )
    except FileNotFoundError:
        return None, f"the engine interpreter {interpreter} does not exist"
    except subprocess.TimeoutExpired:
        return None, f"{interpreter} did not finish the parser check within {timeout_s:g} s"
    except OSError as e:
        return None, f"cannot run {interpreter}: {e.strerror}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"the parser check printed no answer (rc {proc.returncode}): {tail}"
    if not answer.get("ok"):
        return None, str(answer.get("error") or "sglang is not importable there")
    return answer, None


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
    from sglang_supervisor.shell.apikey import read_api_key  # noqa: PLC0415 (doctor's only other use is --url)

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


def gather_host(
    config: Config, extra_ports: Mapping[int, str], tp_size: int, env: Mapping[str, str]
) -> tuple[HostFacts, dict[str, Any]]:
    nvml = gpu.default()
    snap = nvml.snapshot() if nvml.available() else None
    gpus = _visible_gpus(snap, env) if snap is not None else []
    link: gpu.P2PLink | None = None
    if len(gpus) >= 2 and tp_size >= 2:
        order: list[gpu.P2PLink] = ["none", "unknown", "pcie-p2p", "nvlink"]
        ranks = [order.index(nvml.p2p_link(gpus[0].index, g.index)) for g in gpus[1:tp_size]]
        link = order[min(ranks)]  # the slowest link bounds the allreduce
    checked = {config.engine.port: "engine HTTP"}
    if config.metrics.enabled:
        checked.setdefault(parse_address(config.metrics.address)[1], "supervisor metrics")  # validated
    checked.update({p: w for p, w in extra_ports.items() if p not in checked})
    checked = {p: w for p, w in checked.items() if p}
    busy = {p: w for p, w in checked.items() if port_busy(config.engine.host, p)}
    api_key = _api_key_or_none(config) if busy else None
    running = {p: h for p in busy if (h := port_holder(config, p, api_key)) is not None}
    # A running engine on our port holds its GPUs: its processes are ours, not foreign.
    ours = ports.server_processes(config.engine.port) if config.engine.port in running else {}
    engine_gpu, foreign = gpu_process_lines(gpus, ours)
    log_dir = str(Path(config.engine.log_file).parent)
    dirs: dict[str, tuple[str, str]] = {
        config.state_dir: ("state directory", dir_status(config.state_dir)),
        log_dir: ("engine log directory", dir_status(log_dir)),
    }
    if config.runtime_dir:
        dirs[config.runtime_dir] = ("runtime directory", dir_status(config.runtime_dir))
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".cache")
    dirs.setdefault(cache, ("kernel/JIT cache directory", dir_status(cache)))
    model: ModelInfo | None = None
    model_error: str | None = None
    try:
        model = read_model_dir(config.engine.model_path)
    except ModelInfoError as e:
        # a Hugging Face id is valid (CONFIG.md): SGLang downloads it at the first start
        model_error = None if looks_like_hub_id(config.engine.model_path) else str(e)
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
    summary = {
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
            for g in gpus
        ],
        "foreign_processes": foreign,
        "engine_gpu_processes": engine_gpu,
        "tp_link": link,
        "shm_bytes": facts.shm_bytes,
        "memlock_soft": facts.memlock_soft,
        "ports": {str(p): ("running" if p in running else "busy" if p in busy else "free")
                  for p in sorted(checked)},
        "dirs": {path: status for path, (_, status) in sorted(dirs.items())},
        "model": model.to_dict() if model else None,
        "model_error": model_error,
    }
    return facts, summary


# --------------------------------------------------------------------------------------------
# Config -> profile views
# --------------------------------------------------------------------------------------------


def _written_args(config: Config, name: str) -> list[str]:
    args, _ = effective_overlay(config, name)
    engine = config.engine
    out = ["--model-path", engine.model_path, "--host", engine.host, "--port", str(engine.port)]
    for flag, value in args.items():
        out += profiles.flag_tokens(flag, value)
    return out


def _engine_findings(
    config: Config,
    version: str,
    *,
    interpreter: str,
    real_parser: bool,
    report: Report,
    runner: Callable[..., tuple[dict[str, Any] | None, str | None]],
    model: ModelInfo | None,
    host: HostFacts,
    environ: Mapping[str, str],
) -> None:
    base_len = len(profiles.base_command(config, sys.executable))
    views: list[ProfileView] = []
    rendered_json: list[dict[str, object]] = []
    catalog = flag_catalog(version)
    # Profiles by the environment their engine gets: the parser runs once per distinct one.
    by_env: dict[tuple[tuple[str, str], ...], list[ProfileView]] = {}
    for p in config.profiles:
        rc = profiles.render(config, p.name, version, api_key=profiles.REDACTED,
                             secret_config_path=profiles.default_secret_config_path(config, os.environ))
        _, written_env = effective_overlay(config, p.name)
        sglang_args = tuple(rc.argv[base_len:])
        view = ProfileView(p.name, sglang_args, written_env, tuple(_written_args(config, p.name)))
        views.append(view)
        by_env.setdefault(tuple(sorted(rc.env.items())), []).append(view)
        rendered_json.append(rc.to_json())
        report.findings += audit.migration_findings(p.name, version, rc.migrations)
        report.findings += audit.catalog_findings(p.name, version, rc.problems)
    parser_state = "not run"
    if real_parser:
        ran: list[str] = []
        for overlay, group in by_env.items():
            env = engine_env(environ, dict(overlay))
            answer, why_not = runner(interpreter, {v.name: list(v.args) for v in group}, env=env)
            if answer is None:
                parser_state = f"unavailable: {why_not}"
                names = ", ".join(v.name for v in group)
                report.findings.append(
                    Finding(
                        "warning",
                        "engine",
                        "the real SGLang argument parser could not be run"
                        + (f" for {names}" if len(by_env) > 1 else ""),
                        f"{why_not}; flags were checked against the supervisor's catalogue only",
                        f"install sglang into {interpreter}'s venv, or point engine.interpreter at it",
                        "parser.unavailable",
                    )
                )
                continue
            ran.append(str(answer.get("version")))
            results = answer.get("results") or {}
            for v in group:
                report.findings += audit.parser_findings(v.name, results.get(v.name), answer.get("version"))
        if ran and not parser_state.startswith("unavailable"):
            parser_state = f"sglang {ran[0]} via {interpreter}"
    tp = max((parse_flags(v.args, catalog).int("--tp-size", 1) or 1) for v in views)
    for v in views:
        report.findings += audit.audit_profile(
            v, version, model, gpus=host.gpus, link=host.tp_link, catalog=catalog
        )
    report.engine.update({"parser": parser_state, "profiles": rendered_json, "tp_size": tp})


def _encoder_ports(config: Config, version: str) -> dict[int, str]:
    catalog = flag_catalog(version)
    found: dict[int, str] = {}
    for p in config.profiles:
        flags = parse_flags(_written_args(config, p.name), catalog)
        if flags.on("--language-only"):
            port = flags.int("--encoder-bootstrap-port", ENCODER_BOOTSTRAP_PORT_DEFAULT)
            if port:
                found[port] = f"encoder bootstrap (--language-only, profile {p.name})"
    return found


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
    version_source = "config" if config.engine.version != "auto" else "detected"
    try:
        version = detect_engine_version(config, VERSION_TIMEOUT_S, environ=environ)
    except ConfigError as e:
        version = known_versions()[-1]
        version_source = "assumed"
        report.findings.append(
            Finding(
                "warning",
                "engine",
                f"the installed sglang version is unknown; auditing for {version}",
                "; ".join(p.problem for p in e.problems),
                "; ".join(p.fix for p in e.problems),
                "engine.version",
            )
        )
    else:
        report.findings.append(
            Finding(
                "info",
                "engine",
                f"sglang {version} ({version_source})",
                f"interpreter {interpreter}",
                "",
                "engine.version",
            )
        )
    report.engine.update({"interpreter": interpreter, "version": version, "version_source": version_source})
    overlay_tp = max(
        int(str(effective_overlay(config, p.name)[0].get("tp-size") or 1)) for p in config.profiles
    )
    env = {**environ, **config.engine.env}
    host, host_summary = gather_host(config, _encoder_ports(config, version), overlay_tp, env)
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
    _engine_findings(
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


# --------------------------------------------------------------------------------------------
# The unit's view (ProtectHome, ProtectSystem, User): see unitview.py
# --------------------------------------------------------------------------------------------

SYSTEMCTL_TIMEOUT_S = 10.0


def unit_for(
    config_path: str, systemctl: Callable[[Sequence[str]], str | None]
) -> tuple[str, dict[str, str]] | None:
    """The unit that runs `config_path` (/etc/sglang-supervisor/NAME.yaml: sglang-NAME.service, else
    the template's instance) and its `systemctl show` properties when systemd has it loaded."""
    p = Path(config_path).resolve()
    name = p.stem
    units = (f"sglang-{name}.service", f"sglang-supervisor@{name}.service")
    for unit in units:
        out = systemctl(["show", unit, *(f"--property={k}" for k in unitview.SHOW_PROPERTIES)])
        props = dict(line.split("=", 1) for line in (out or "").splitlines() if "=" in line)
        if props.get("LoadState") == "loaded" and f"/{name}.yaml" in _exec_start(systemctl, unit):
            return unit, props
    if p.parent == Path("/etc/sglang-supervisor"):
        return units[1], {}
    return None


def _exec_start(systemctl: Callable[[Sequence[str]], str | None], unit: str) -> str:
    return systemctl(["show", unit, "--property=ExecStart"]) or ""


def run_systemctl(args: Sequence[str]) -> str | None:
    if not Path("/run/systemd/system").is_dir():
        return None  # systemd is not running here: the shipped defaults stand in
    try:
        proc = subprocess.run(["systemctl", "--no-pager", *args], capture_output=True, text=True,
                              timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def blocked_for(path: str, user: str) -> str | None:
    """The first directory on `path`'s way that `user` may not enter (no x for it), or None."""
    import grp  # noqa: PLC0415 (POSIX only, doctor only)
    import pwd  # noqa: PLC0415

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None  # no such user yet (postinst/install.sh creates it): nothing to judge
    if pw.pw_uid == 0:
        return None
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    d = Path(path)
    for parent in reversed((d, *d.parents) if d.is_dir() else d.parents):
        try:
            st = parent.stat()
        except OSError:
            return None  # missing paths are reported elsewhere
        if st.st_uid == pw.pw_uid:
            ok = bool(st.st_mode & 0o100)
        elif st.st_gid in gids:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            return str(parent)
    return None


def unit_needs(config: Config, user: str) -> list[unitview.Need]:
    """What the unit reads and writes for this configuration, each judged for `user`."""
    reinstall = ("rebuild the supervisor's virtualenv on the system interpreter: "
                 "sudo scripts/install.sh (PYTHON=/usr/bin/python3 is its default), or install the package")
    found: list[tuple[str, str, bool, str]] = []
    for exe in (sys.executable, os.path.realpath(sys.executable),
                os.path.realpath(getattr(sys, "_base_executable", sys.executable))):
        found.append(("supervisor's interpreter", exe, False, reinstall))
    engine_py = engine_interpreter(config)
    first = config.engine.command[0].replace("{python}", sys.executable)
    if not os.path.isabs(first):
        first = shutil.which(first) or first
    for exe in {first, engine_py, os.path.realpath(engine_py)}:
        if os.path.isabs(exe):
            found.append(("engine command", exe, False, ""))
    if os.path.isabs(config.engine.model_path):
        found.append(("model", config.engine.model_path, False, ""))
    if config.engine.api_key_file:
        found.append(("API key file", config.engine.api_key_file, False,
                      "use a systemd credential instead (LoadCredential=, see docs/OPERATIONS.md)"))
    found.append(("state directory", config.state_dir, True, ""))
    found.append(("engine log directory", str(Path(config.engine.log_file).parent), True, ""))
    if config.runtime_dir:
        found.append(("runtime directory", config.runtime_dir, True, ""))
    return [unitview.Need(purpose, path, write, None if write else blocked_for(path, user), fix)
            for purpose, path, write, fix in found]


def unit_view_report(config: Config, config_path: str, report: Report,
                     systemctl: Callable[[Sequence[str]], str | None] = run_systemctl) -> None:
    found = unit_for(config_path, systemctl)
    if found is None:
        return  # not a configuration a unit runs (a file outside /etc/sglang-supervisor)
    unit, props = found
    sandbox = (unitview.sandbox_from_show(unit, props, f"systemctl show {unit}") if props
               else unitview.shipped_sandbox(unit))
    report.findings += unitview.unit_view_findings(unit_needs(config, sandbox.user), sandbox)
    report.host["unit"] = {"unit": unit, "source": sandbox.source, "user": sandbox.user,
                           "protect_home": sandbox.protect_home, "protect_system": sandbox.protect_system}


# --------------------------------------------------------------------------------------------
# Live
# --------------------------------------------------------------------------------------------


def fallback_findings(status: Any, profile_names: Sequence[str]) -> list[Finding]:
    """The supervisor's /status -> whether the live server runs below its best profile, and why."""
    if not isinstance(status, dict) or not profile_names:
        return []
    profile = status.get("profile")
    if not isinstance(profile, str) or not profile:
        return []
    best = profile_names[0]
    if profile == best:
        return [Finding("ok", "live", f"the supervisor serves the best profile ({best})", "", "",
                        "live.profile")]
    level = profile_names.index(profile) if profile in profile_names else None
    why: list[str] = []
    for a in status.get("attempts") or []:
        if isinstance(a, dict) and a.get("failure_class") and a.get("profile") != profile:
            why.append(f"{a.get('profile')} failed ({a.get('failure_class')})")
    skipped = status.get("skipped_known_bad")
    if isinstance(skipped, dict) and skipped:
        why.append("skipped as known bad: " + ", ".join(str(k) for k in skipped))
    return [Finding(
        "warning", "live",
        f"the live server runs the fallback profile {profile}"
        + (f" (level {level} of the ladder)" if level is not None else "") + f", not {best}",
        "; ".join(why) or "an earlier start fell back (see journalctl -u the unit, EVENT=profile.fallback)",
        "find the cause (journalctl ... FAILURE_CLASS), fix it, then restart the unit to try the "
        "better profile again (sglang-supervisor run --retry-known-bad ignores remembered failures)",
        "live.fallback")]


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


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def format_human(report: Report) -> str:
    lines: list[str] = []
    findings = audit.sort_findings(report.findings)
    for area in audit.AREAS:
        group = [f for f in findings if f.area == area]
        if not group:
            continue
        lines.append(f"== {_AREA_TITLE[area]}")
        profile: str | None = None
        for f in group:
            if f.profile != profile and f.profile is not None:
                lines.append(f"  -- profile {f.profile}")
            profile = f.profile
            indent = "    " if f.profile else "  "
            lines.append(f"{indent}{_MARK[f.severity]} {f.what}")
            if f.why:
                lines.append(f"{indent}      why: {f.why}")
            if f.fix:
                lines.append(f"{indent}      fix: {f.fix}")
        lines.append("")
    counts = {s: sum(1 for f in findings if f.severity == s) for s in audit.SEVERITIES}
    lines.append(
        f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s), "
        f"{counts['ok']} ok"
    )
    return "\n".join(lines)


def quiet_logging() -> None:
    """NVML and config warnings are findings here; keep stdout for the report."""
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(40),
    )


def build_report(args: argparse.Namespace) -> Report:
    report = Report()
    config: Config | None = None
    config_path = getattr(args, "config", None)
    if config_path and (Path(config_path).exists() or not args.url):
        try:
            config = load_config(
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
    if config is not None:
        report.engine["config"] = str(config_path)
        try:
            config_report(config, report)
            unit_view_report(config, str(config_path), report)
            report.findings = audit.collapse_common(report.findings, config.profile_names)
        except ConfigError as e:  # e.g. a profile whose `extends` chain cannot render
            for p in e.problems:
                report.findings.append(
                    Finding("error", "engine", f"{p.path}: {p.problem}", "rendering", p.fix, "config.render")
                )
    if args.url:
        api_key: str | None = None
        if config is not None:
            try:
                from sglang_supervisor.shell.apikey import read_api_key  # noqa: PLC0415 (only for --url)

                api_key = read_api_key(config.engine)
            except ConfigError:
                api_key = os.environ.get("SGLANG_API_KEY")
        else:
            api_key = os.environ.get("SGLANG_API_KEY")
        live_report(args.url, report, api_key)
        if config is not None and config.metrics.enabled:
            status = supervisor_status(config.metrics.address)
            report.findings += fallback_findings(status, config.profile_names)
            if isinstance(status, dict) and report.live is not None:
                report.live["supervisor_profile"] = status.get("profile")
    return report


def main(args: argparse.Namespace) -> int:
    quiet_logging()
    report = build_report(args)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=False, default=str))
    else:
        print(format_human(report))
    return 1 if audit.has_errors(report.findings) else 0
