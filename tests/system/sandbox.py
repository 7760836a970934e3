"""A real systemd as PID 1 of its own namespaces, for the system test tier.

CI machines do not boot systemd, yet units must be proven under it: Type=notify, WatchdogSec,
Restart=, journald. systemd runs fine as PID 1 of fresh pid/mount/cgroup/uts/ipc namespaces with
a private cgroup2 tree and a private /run. It still shares the host's root file system, network,
/dev and users, so everything that would modify the host (tmpfiles would wipe the host's /tmp,
udev, sysctl, timers...) is masked at runtime before systemd starts.

    box = Sandbox("sglang-systest")
    box.up()
    box.run("systemctl", "start", "x.service")
    box.journal("x.service")   # list of journal entries (dicts)
    box.down()
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

SYSTEMD = Path("/lib/systemd/systemd")
EXAMPLES = Path("/usr/share/sglang-supervisor/examples")  # /etc holds only operator files

# Units that must never run in a sandbox sharing the host's root file system and kernel.
MASKED_UNITS = (
    # tmpfiles' `D /tmp` would wipe the host's /tmp; the others write the host's /etc, /var, /dev
    "systemd-tmpfiles-setup.service", "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.service", "systemd-tmpfiles-clean.timer",
    "systemd-sysusers.service", "systemd-firstboot.service", "systemd-machine-id-commit.service",
    "systemd-random-seed.service", "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service", "systemd-update-done.service", "ldconfig.service",
    "systemd-journal-catalog-update.service", "systemd-hwdb-update.service",
    "systemd-remount-fs.service", "systemd-journal-flush.service",
    # kernel and hardware
    "systemd-udevd.service", "systemd-udev-trigger.service", "systemd-udev-settle.service",
    "systemd-udevd-control.socket", "systemd-udevd-kernel.socket", "kmod-static-nodes.service",
    "systemd-modules-load.service", "systemd-sysctl.service", "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount", "proc-sys-fs-binfmt_misc.mount", "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount", "sys-kernel-config.mount", "sys-fs-fuse-connections.mount",
    "dev-hugepages.mount", "dev-mqueue.mount", "systemd-pstore.service",
    "systemd-timesyncd.service", "systemd-time-wait-sync.service", "systemd-pcrphase.service",
    "systemd-pcrphase-sysinit.service", "systemd-repart.service",
    "systemd-boot-system-token.service", "systemd-journald-audit.socket",
    # consoles and logins
    "getty.target", "getty@tty1.service", "console-getty.service", "serial-getty@ttyS0.service",
    "systemd-ask-password-console.path", "systemd-ask-password-wall.path",
    "systemd-logind.service",
    # timers and services a Debian image enables (prometheus: the tests start their own)
    "timers.target", "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
    "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer", "man-db.timer", "logrotate.timer",
    "systemd-networkd.service", "systemd-resolved.service", "prometheus.service",
    "prometheus-node-exporter.service",
)  # fmt: skip

TARGET = """[Unit]
Description=sandbox boot target (sysinit + journald + sockets)
Requires=sysinit.target
Wants=systemd-journald.socket systemd-journald-dev-log.socket sockets.target
After=sysinit.target sockets.target
AllowIsolate=yes
"""

# Runs as PID 1 of the new pid namespace: prepare the file system view, then exec systemd.
INIT_SCRIPT = r"""
set -eu
state=$1; systemd=$2; tag=$3
# read before /run (where the state directory may live) is replaced by a tmpfs
masked=$(cat "$state/masked"); target=$(cat "$state/sandbox.target")
mount --make-rprivate /
mount --bind "$state/console.log" /dev/console
[ -e /dev/kmsg ] && mount --bind /dev/null /dev/kmsg
if mountpoint -q /sys/fs/cgroup; then umount -R /sys/fs/cgroup; fi
mount -o remount,bind,ro,nosuid,nodev,noexec /sys
mount -t cgroup2 -o rw,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro,nosuid,nodev,noexec /proc/sys
if [ -e /proc/sysrq-trigger ]; then
  mount --bind /proc/sysrq-trigger /proc/sysrq-trigger
  mount -o remount,bind,ro /proc/sysrq-trigger
fi
mount -t tmpfs -o mode=0755,nosuid,nodev,size=25% tmpfs /run
mkdir -p /run/lock /run/systemd/system /run/systemd/journald.conf.d
chmod 1777 /run/lock
printf '[Journal]\nStorage=volatile\nReadKMsg=no\nRateLimitBurst=0\n' \
  > /run/systemd/journald.conf.d/50-sandbox.conf
for unit in $masked; do ln -sf /dev/null "/run/systemd/system/$unit"; done
printf '%s\n' "$target" > /run/systemd/system/sandbox.target
exec env -i container="$tag" LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "$systemd" --unit=sandbox.target --log-target=journal
"""


class SandboxUnavailable(RuntimeError):
    """This host cannot run the sandbox (not root, no namespaces, no systemd binary)."""


def unavailable_reason() -> str | None:
    """Why the sandbox cannot run here, or None when it can."""
    if os.uname().sysname != "Linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "needs root (mount, pid and cgroup namespaces)"
    if not SYSTEMD.exists():
        return f"no systemd binary at {SYSTEMD} (apt-get install systemd)"
    for tool in ("unshare", "nsenter", "setpriv", "mount", "systemctl", "journalctl"):
        if shutil.which(tool) is None:
            return f"missing command {tool}"
    with contextlib.suppress(OSError):
        if Path("/proc/1/comm").read_text().strip() == "systemd":
            return "the host runs systemd as PID 1: this harness is for hosts without it"
    if "cgroup2" not in Path("/proc/filesystems").read_text():
        return "kernel without cgroup2"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--cgroup", "--uts", "--ipc", "true"],
        capture_output=True, check=False,
    )
    if probe.returncode != 0:
        return "cannot create pid/mount/cgroup namespaces here (unprivileged container?)"
    return None


def _host_cgroup2() -> Path:
    for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if os.path.ismount(p) and _fstype(p) == "cgroup2":
            return p
    mnt = Path("/run/sglang-systest-cgroup2")
    mnt.mkdir(parents=True, exist_ok=True)
    if _fstype(mnt) != "cgroup2":
        subprocess.run(
            ["mount", "-t", "cgroup2", "-o", "nosuid,nodev,noexec", "cgroup2", str(mnt)], check=True
        )
    return mnt


def _fstype(path: Path) -> str:
    best, fstype = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mnt = fields[1].replace("\\040", " ")
        if (str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, fields[2]
    return fstype


def _cgroup_procs(root: Path) -> list[int]:
    pids: list[int] = []
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids += [int(x) for x in procs.read_text().split()]
    return pids


class Sandbox:
    def __init__(self, name: str, state_root: Path = Path("/run/sglang-systest")) -> None:
        self.name = name
        self.state = state_root / name
        self.cgroup = _host_cgroup2() / name
        self.pid = 0
        self._launcher: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------- lifecycle
    def up(self, timeout: float = 30.0) -> None:
        reason = unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)
        self._clean_leftovers()
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "console.log").write_text("")
        (self.state / "masked").write_text("\n".join(MASKED_UNITS) + "\n")
        (self.state / "sandbox.target").write_text(TARGET)
        self.cgroup.mkdir(parents=True, exist_ok=True)
        own_cgroup = Path("/proc/self/cgroup").read_text().split("::", 1)[-1].strip()
        cg_procs = self.cgroup / "cgroup.procs"

        def enter_cgroup() -> None:  # in the child, before exec: the sandbox's cgroup root
            cg_procs.write_text("0")

        log = (self.state / "launcher.log").open("wb")
        self._launcher = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--uts",
             "--ipc", "--cgroup", "--propagation", "private", "--",
             "/bin/sh", "-c", INIT_SCRIPT, "init", str(self.state), str(SYSTEMD), "sglang-systest"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=enter_cgroup,  # noqa: PLW1509 (no threads here)
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while not self.pid:
            children = Path(f"/proc/{self._launcher.pid}/task/{self._launcher.pid}/children")
            with contextlib.suppress(OSError, ValueError, IndexError):
                child = int(children.read_text().split()[0])
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    self.pid = child
            if self._launcher.poll() is not None or time.monotonic() > deadline:
                diag = self._diagnostics()
                self.down()
                raise RuntimeError(f"systemd did not start: {diag}")
            time.sleep(0.05)
        # the launcher (outside the new pid namespace) leaves the sandbox's cgroup
        with contextlib.suppress(OSError):
            (_host_cgroup2() / own_cgroup.lstrip("/") / "cgroup.procs").write_text(str(self._launcher.pid))
        while True:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return
            if time.monotonic() > deadline:
                diag = self._diagnostics()
                self.down()
                raise RuntimeError(f"systemd not ready after {timeout}s (state {state!r}): {diag}")
            time.sleep(0.1)

    def down(self, timeout: float = 20.0) -> None:
        if self.pid and Path(f"/proc/{self.pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGRTMIN + 4)  # systemd: poweroff
            deadline = time.monotonic() + timeout
            while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # kills the whole pid namespace
        if self._launcher is not None:
            try:
                self._launcher.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._launcher.kill()
                self._launcher.wait()
        self._clean_leftovers()
        self.pid = 0

    def _clean_leftovers(self) -> None:
        if self.cgroup.exists():
            if _cgroup_procs(self.cgroup):
                with contextlib.suppress(OSError):
                    (self.cgroup / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 5
            while _cgroup_procs(self.cgroup) and time.monotonic() < deadline:
                time.sleep(0.05)
            for d in sorted(self.cgroup.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if d.is_dir():
                    with contextlib.suppress(OSError):
                        d.rmdir()
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
        shutil.rmtree(self.state, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.state.parent.rmdir()  # only when no other sandbox uses it

    def _diagnostics(self) -> str:
        parts = []
        for name in ("launcher.log", "console.log"):
            with contextlib.suppress(OSError):
                parts.append(f"{name}: {(self.state / name).read_text()[-3000:]}")
        return "\n".join(parts)

    # ---------------------------------------------------------------- inside
    @property
    def root(self) -> Path:
        """The host path of the sandbox's view of / (its private /run lives there)."""
        return Path(f"/proc/{self.pid}/root")

    def run(
        self, *argv: str, check: bool = True, timeout: float = 120.0, input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the sandbox; it dies with us (pdeathsig) if the test is killed."""
        if not self.pid:
            raise RuntimeError("sandbox is not up")
        exec_cg = self.cgroup / "sandbox-exec"
        exec_cg.mkdir(exist_ok=True)

        def enter_cgroup() -> None:
            with contextlib.suppress(OSError):
                (exec_cg / "cgroup.procs").write_text("0")

        base_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
        cmd = ["nsenter", "--target", str(self.pid), "--mount", "--pid", "--uts", "--ipc", "--cgroup",
               "--wd=/", "--", "setpriv", "--pdeathsig", "TERM", "--", *argv]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, input=input, check=False,
            env={**base_env, **(env or {})}, preexec_fn=enter_cgroup,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout).stdout

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props))
        values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return {p: values.get(p, "") for p in props}

    def prop(self, unit: str, name: str) -> str:
        return self.show(unit, name)[name]

    def wait_for(self, what: str, predicate: Any, timeout: float, interval: float = 0.2) -> Any:
        """Poll predicate() until it returns a truthy value; fail with `what` after timeout."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")

    def diagnose(self, unit: str) -> str:
        """systemctl status and the journal's tail of `unit`, for a failure message."""
        status = self.systemctl("status", unit, check=False)
        tail = self.run("journalctl", "--no-pager", "-u", unit, "-n", "40", check=False).stdout
        return f"{status}\n--- journal\n{tail}"

    def wait_active(self, unit: str, timeout: float) -> None:
        """Until `unit` is active; failed, or not active within `timeout`: an AssertionError that
        carries its diagnosis."""
        def state() -> bool:
            s = self.prop(unit, "ActiveState")
            assert s != "failed", f"{unit} failed"  # the diagnosis is added once, below
            return s == "active"

        try:
            self.wait_for(f"{unit} active", state, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnose(unit)}") from None

    def write_runtime_file(self, relpath: str, text: str) -> Path:
        """A file under the sandbox's private /run (unit files, drop-ins): gone at teardown."""
        path = self.root / "run" / relpath.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def dropin(self, unit: str, name: str, text: str) -> None:
        self.write_runtime_file(f"systemd/system/{unit}.d/{name}.conf", text)
        self.systemctl("daemon-reload")

    def journal(self, *args: str, unit: str | None = None) -> list[dict[str, Any]]:
        argv = ["journalctl", "--no-pager", "-o", "json", *args]
        if unit:
            argv += ["-u", unit]
        self.run("journalctl", "--sync", check=False)
        out = self.run(*argv, check=False).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def unit_pids(self, unit: str) -> list[int]:
        """PIDs (in the sandbox's namespace, as MainPID) of every process in the unit's cgroup."""
        cg = self.prop(unit, "ControlGroup")
        if not cg:
            return []
        # quoted: a template instance's slice is escaped (system-sglang\x2dsupervisor.slice)
        where = shlex.quote(f"/sys/fs/cgroup{cg}")
        out = self.run("sh", "-c", f"cat $(find {where} -name cgroup.procs) 2>/dev/null",
                       check=False).stdout
        return sorted(int(x) for x in out.split())

    def alive(self, pids: Sequence[int]) -> list[int]:
        """The sandbox PIDs that still exist and are not zombies (read through its /proc)."""
        out = []
        for pid in pids:
            try:
                stat = (self.root / "proc" / str(pid) / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        return out


POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def allow_service_actions(box: Sandbox) -> None:
    """Maintainer scripts act on services as on a real server, where no policy-rc.d forbids them.

    Container images (this CI host too) ship a policy-rc.d that exits 101 (deny): every
    deb-systemd-invoke/invoke-rc.d start, stop and restart is skipped, which hid a package upgrade
    that stopped sglang-qwen for good. Inside the sandbox's own mount namespace an allowing policy
    (exit 0) is bound over it; the host keeps its own."""
    if not POLICY_RC_D.exists():
        return
    allow = box.write_runtime_file("systest-policy-rc.d", "#!/bin/sh\nexit 0\n")
    allow.chmod(0o755)
    box.run("mount", "--bind", "/run/systest-policy-rc.d", str(POLICY_RC_D))
    assert box.run(str(POLICY_RC_D), "sglang-qwen.service", "stop", check=False).returncode == 0


@contextlib.contextmanager
def booted(name: str) -> Iterator[Sandbox]:
    box = Sandbox(name)
    box.up()
    try:
        yield box
    finally:
        box.down()



# The drop-in every system test puts on the units it starts: a fast simulator, fast restarts and
# no start limit (the tests restart on purpose).
TEST_DROPIN = """[Unit]
StartLimitIntervalSec=0
[Service]
Environment=SGLANG_SIM_TIME_SCALE=0.05
RestartSec=1s
TimeoutAbortSec=10s
"""


def free_port() -> int:
    """A loopback port free now (the sandbox shares the host's network)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def unit_demo_config(name: str) -> dict[str, Any]:
    """The packaged demo configuration as unit `sglang-supervisor@NAME` runs it: under the unit's
    directories, metrics on a free loopback port, logs to the journal, a short drain and kill."""
    cfg: dict[str, Any] = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    cfg["name"] = name
    cfg["state_dir"] = "/var/lib/sglang-supervisor"
    cfg["engine"]["port"] = free_port()
    cfg["engine"]["log_file"] = f"/var/log/sglang-supervisor/{name}-engine.log"
    cfg["metrics"]["address"] = f"127.0.0.1:{free_port()}"
    cfg["logging"]["format"] = "journald"
    cfg["timeouts"].update(drain_s=5, kill_s=5)
    return cfg


@contextlib.contextmanager
def template_instance(installed: Sandbox, name: str) -> Iterator[Sandbox]:
    """Unit `sglang-supervisor@NAME` with TEST_DROPIN, for a module's tests; afterwards stopped,
    its configuration and its state files removed (the journal of sglang-qwen stays untouched)."""
    unit = f"sglang-supervisor@{name}.service"
    installed.dropin(unit, "50-systest", TEST_DROPIN)
    yield installed
    installed.systemctl("stop", unit, check=False)
    (Path("/etc/sglang-supervisor") / f"{name}.yaml").unlink(missing_ok=True)
    for leftover in Path("/var/lib/sglang-supervisor").glob(f"{name}.state.json*"):
        leftover.unlink()
