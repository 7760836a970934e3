"""doctor's look through the systemd unit's eyes: which unit runs a configuration, its sandbox
(`systemctl show`, or the shipped unit's defaults when systemd does not have it), and what the
unit must reach for this configuration, judged for its user (the rules are core/unitview.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sglang_supervisor.core import unitview
from sglang_supervisor.core.audit import Finding
from sglang_supervisor.core.config import Config
from sglang_supervisor.engine.detect import engine_interpreter

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


def unit_view(
    config: Config, config_path: str, systemctl: Callable[[Sequence[str]], str | None] = run_systemctl
) -> tuple[list[Finding], dict[str, Any]] | None:
    """The findings of the unit's view and what doctor reports of the unit; None when no unit runs
    `config_path` (a file outside /etc/sglang-supervisor)."""
    found = unit_for(config_path, systemctl)
    if found is None:
        return None
    unit, props = found
    sandbox = (unitview.sandbox_from_show(unit, props, f"systemctl show {unit}") if props
               else unitview.shipped_sandbox(unit))
    findings = unitview.unit_view_findings(unit_needs(config, sandbox.user), sandbox)
    return findings, {"unit": unit, "source": sandbox.source, "user": sandbox.user,
                      "protect_home": sandbox.protect_home, "protect_system": sandbox.protect_system}
