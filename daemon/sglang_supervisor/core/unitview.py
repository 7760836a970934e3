"""What the systemd unit can see: paths the supervisor needs, judged under the unit's sandbox.

`check` and `doctor` run as root in the operator's shell, where /root/.pyenv, /home/alice/models
and /etc are all there. The unit runs as `sglang` with ProtectHome=yes (/home, /root and /run/user
are empty) and ProtectSystem=strict (everything read-only but its State/Logs/Cache/Runtime
directories and ReadWritePaths=). A venv built on a pyenv interpreter then fails with 203/EXEC while
both commands pass. These pure functions say which needed path the unit would not see, not
reach, or not write, and how to fix it; `doctor` gathers the facts (`systemctl show`, stat).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sglang_supervisor.core.audit.findings import Finding

HOME_DIRS = ("/home", "/root", "/run/user")
# ProtectSystem= level -> the trees it makes read-only (strict: everything but the API file systems)
READ_ONLY_TREES = {
    "yes": ("/usr", "/boot", "/efi"), "full": ("/usr", "/boot", "/efi", "/etc"), "strict": ("/",),
}
# directories systemd keeps writable under ProtectSystem=strict regardless (PrivateTmp, API mounts)
ALWAYS_WRITABLE = ("/tmp", "/var/tmp", "/dev", "/proc", "/sys")  # noqa: S108 (names, not files we use)


@dataclass(frozen=True)
class UnitSandbox:
    """The settings of the unit that runs a configuration (systemctl show, or the shipped defaults)."""

    unit: str
    source: str  # where these settings come from, for the finding's "why"
    user: str = "sglang"
    protect_home: str = "yes"  # yes | read-only | tmpfs | no
    protect_system: str = "strict"  # strict | full | yes | no
    writable: tuple[str, ...] = ()  # absolute: State/Logs/Cache/RuntimeDirectory=, ReadWritePaths=
    bound: tuple[str, ...] = ()  # destinations of BindPaths=/BindReadOnlyPaths= (visible again)


@dataclass(frozen=True)
class Need:
    """A path the unit needs: what it is, whether it must be writable, and how the service user
    reaches it (None: fine; else the directory on its way it cannot enter)."""

    purpose: str
    path: str
    write: bool = False
    blocked_by: str | None = None
    fix: str = ""


def under(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return root in ("/", path) or path.startswith(root.rstrip("/") + "/")


def hidden_by_protect_home(path: str, sb: UnitSandbox) -> str | None:
    """The home tree that hides `path` in the unit (ProtectHome=yes|tmpfs), or None."""
    if sb.protect_home not in ("yes", "tmpfs", "true"):
        return None
    if any(under(path, b) for b in sb.bound):
        return None
    return next((h for h in HOME_DIRS if under(path, h)), None)


def read_only_in_unit(path: str, sb: UnitSandbox) -> bool:
    trees = READ_ONLY_TREES.get(sb.protect_system, ())
    if not any(under(path, t) for t in trees):
        return False
    return not any(under(path, w) for w in (*sb.writable, *ALWAYS_WRITABLE))


def home_fix(purpose: str, path: str, sb: UnitSandbox) -> str:
    return (f"move it out of the home directories (e.g. /opt or /srv), or add a drop-in "
            f"(systemctl edit {sb.unit.removesuffix('.service')}): [Service] ProtectHome=tmpfs "
            f"BindReadOnlyPaths={posixpath.dirname(path.rstrip('/')) or path}")


def unit_view_findings(needs: Iterable[Need], sb: UnitSandbox) -> list[Finding]:
    out: list[Finding] = []
    seen: set[str] = set()
    for n in needs:
        if n.path in seen:
            continue
        seen.add(n.path)
        home = hidden_by_protect_home(n.path, sb)
        if home is not None:
            out.append(Finding(
                "error", "host", f"{sb.unit} cannot see the {n.purpose} {n.path}",
                f"ProtectHome={sb.protect_home} hides {home} from the unit ({sb.source}); "
                "it passes here because you run it as yourself",
                n.fix or home_fix(n.purpose, n.path, sb), "unit.hidden"))
            continue
        if n.blocked_by is not None:
            out.append(Finding(
                "error", "host", f"the service user {sb.user} cannot reach the {n.purpose} {n.path}",
                f"{n.blocked_by} does not let {sb.user} in (mode or owner)",
                n.fix or f"make the path readable by {sb.user} (e.g. chmod o+x on the directories), "
                "or move it under /opt or /srv", "unit.unreachable"))
            continue
        if n.write and read_only_in_unit(n.path, sb):
            out.append(Finding(
                "error", "host", f"the {n.purpose} {n.path} is read-only in {sb.unit}",
                f"ProtectSystem={sb.protect_system} leaves only {', '.join(sb.writable) or 'nothing'} "
                f"writable ({sb.source})",
                f"use a path under {sb.writable[0] if sb.writable else '/var/lib'}, or a drop-in with "
                f"ReadWritePaths={n.path}", "unit.read_only"))
            continue
        out.append(Finding("ok", "host", f"{sb.unit} sees the {n.purpose} {n.path}", "", "", "unit.ok"))
    return out


def _words(value: str) -> list[str]:
    return [w for w in value.split() if w]


def sandbox_from_show(unit: str, props: Mapping[str, str], source: str) -> UnitSandbox:
    """`systemctl show UNIT -p ...` key=value pairs -> UnitSandbox (relative *Directory= names are
    under /var/lib, /var/log, /var/cache and /run, as systemd places them for system units)."""
    writable: list[str] = []
    for key, base in (("StateDirectory", "/var/lib"), ("LogsDirectory", "/var/log"),
                      ("CacheDirectory", "/var/cache"), ("RuntimeDirectory", "/run")):
        writable += [posixpath.join(base, w.split(":")[0]) for w in _words(props.get(key, ""))]
    writable += [w.lstrip("-+") for w in _words(props.get("ReadWritePaths", ""))]
    bound: list[str] = []
    for key in ("BindPaths", "BindReadOnlyPaths"):
        for w in _words(props.get(key, "")):
            parts = w.lstrip("-").split(":")
            bound.append(parts[1] if len(parts) > 1 and parts[1] else parts[0])
    return UnitSandbox(
        unit=unit, source=source, user=props.get("User") or "root",
        protect_home=props.get("ProtectHome") or "no", protect_system=props.get("ProtectSystem") or "no",
        writable=tuple(writable), bound=tuple(bound))


SHOW_PROPERTIES: Sequence[str] = (
    "LoadState", "User", "ProtectHome", "ProtectSystem", "StateDirectory", "LogsDirectory",
    "CacheDirectory", "RuntimeDirectory", "ReadWritePaths", "BindPaths", "BindReadOnlyPaths")


def shipped_sandbox(unit: str) -> UnitSandbox:
    """The shipped template's settings, for hosts where systemd cannot be asked."""
    return UnitSandbox(
        unit=unit, source=f"the shipped unit's settings; {unit} is not loaded here",
        writable=("/var/lib/sglang-supervisor", "/var/log/sglang-supervisor",
                  "/var/cache/sglang-supervisor", f"/run/sglang-supervisor/{unit_name_of(unit)}"))


def unit_name_of(unit: str) -> str:
    """sglang-qwen.service / sglang-supervisor@qwen.service -> qwen."""
    base = unit.removesuffix(".service")
    return base.split("@", 1)[1] if "@" in base else base.removeprefix("sglang-")
