"""docs/OPERATIONS.md, walked top to bottom as an operator types it, in a real systemd.

Every command the guide shows (each line of a ```sh block, and each inline `code` span that starts
with a command such as `systemctl ...`, `sudo ...`, `sglang-model ...`) is run inside the sandbox,
in the guide's order, and must exit 0, unless a rule below says otherwise and why. A command the
rules do not know is run as written: a section another change adds is walked too, and fails here
until it works as documented.

Where the guide needs a GPU and SGLang, the simulator stands in, as the guide's own "Try it on
this host without a GPU" does: the walk edits /etc/sglang-supervisor/qwen.yaml (the step "Point
the configuration at SGLang") to `engine.command: ["sglang-sim"]` and the simulator's model and
clock, then runs every later command unchanged. `nvidia-smi` and other driver tools are not run
(no driver on this tier); the walk prints what it ran and what it did not, with the reason.

`sudo` is dropped (the walk runs as root); `sudoedit FILE` and `systemctl edit UNIT` (editors)
are replaced by writing what the guide says to write. The package is installed with the guide's
own `apt-get install ./packaging/out/...deb` and purged with its `apt-get purge`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from system.sandbox import Sandbox, allow_service_actions, unavailable_reason
from tiers import SANDBOX_FIX, require

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "OPERATIONS.md"
ETC = Path("/etc/sglang-supervisor")
# first words of a command (inline spans); a span of one word, or `systemctl VERB` alone, names a
# command rather than showing one
COMMANDS = ("sudo", "sudoedit", "systemctl", "journalctl", "sglang-supervisor", "sglang-model", "sglang-sim",
            "curl", "scripts/", "packaging/", "apt-get", "systemd-analyze", "systemd-run", "sysctl", "ss",
            "nvidia-smi", "grep", "diff")  # fmt: skip
# ports the guide names: the walk needs them free (another service here would make it lie)
GUIDE_PORTS = (30000, 9400, 30100, 9401)
# inline spans that name a command or an option in prose ("a per-model config created by `sglang-model
# add`"), not a command to run
NAMES = {"sglang-model add", "apt-get -y"}
SIM_ENGINE = {"SGLANG_SIM_VERSION": "0.5.23", "SGLANG_SIM_TIME_SCALE": "0.05"}


@dataclass
class Step:
    section: str
    line: int
    command: str
    dropin: list[str] = field(default_factory=list)  # lines after `systemctl edit UNIT` in a block


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


def extract(text: str) -> list[Step]:
    """The guide's commands in order: ```sh block lines and command-like inline spans."""
    steps: list[Step] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            lang = fence.group(1)
            j = i + 1
            while not lines[j].strip().startswith("```"):
                j += 1
            if lang == "sh":
                for k in range(i + 1, j):
                    cmd = _strip_comment(lines[k])
                    if not cmd:
                        continue
                    if steps and steps[-1].line >= i and " edit " in f" {steps[-1].command} " and (
                            cmd.startswith("[") or "=" in cmd.split()[0]):
                        steps[-1].dropin.append(cmd)  # the drop-in's text, typed into the editor
                        continue
                    steps.append(Step(section, k + 1, cmd))
            i = j + 1
            continue
        # inline spans may wrap: join with the next line when a backtick is left open
        joined = line
        while joined.count("`") % 2 and i + 1 < len(lines):
            i += 1
            joined += " " + lines[i].strip()
        for span in re.findall(r"`([^`]+)`", joined):
            words = span.split()
            if not span.startswith(COMMANDS) or len(words) < 2:
                continue
            if (words[0] == "systemctl" and len(words) == 2) or " ".join(words) in NAMES:
                continue  # "`systemctl stop`": a name
            steps.append(Step(section, i + 1, " ".join(words)))
        i += 1
    return steps


# ------------------------------------------------------------------------------------ the rules
@dataclass
class Walk:
    box: Sandbox
    deb: Path
    tmp: Path
    ran: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    deferred: list[Step] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)

    def sh(self, command: str, *, check: bool = True, input: str | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = self.box.run("sh", "-c", f"cd {REPO} && {command}", check=False, input=input, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"`{command}` exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def edit_yaml(self, path: Path, change: Callable[[dict[str, Any]], None]) -> None:
        data = yaml.safe_load(path.read_text())
        change(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False))


def as_typed(command: str) -> str:
    """The command as root types it: without sudo."""
    return re.sub(r"(^|&& |; )sudo ", r"\1", command)


def gpu_stand_in(cfg: dict[str, Any]) -> None:
    """The guide's "point the configuration at SGLang and the model", with the simulator as SGLang."""
    engine = cfg["engine"]
    engine.update(command=["sglang-sim"], version="0.5.23", model_path="Qwen/Qwen3.6-27B")
    engine.setdefault("env", {}).update(SIM_ENGINE)


def run_step(walk: Walk, step: Step) -> None:
    cmd = step.command
    box = walk.box
    typed = as_typed(cmd)

    def skip(reason: str) -> None:
        walk.not_run.append(f"{step.line}: {cmd}  -- {reason}")

    def run(command: str = typed, *, rc: tuple[int, ...] = (0,), input: str | None = None,
            timeout: float = 600) -> str:
        proc = walk.sh(command, check=False, input=input, timeout=timeout)
        if proc.returncode not in rc:
            journal = walk.sh("journalctl --no-pager -n 60 -o short-precise", check=False).stdout
            pytest.fail(f"OPERATIONS.md line {step.line} ({step.section}): `{cmd}` exited {proc.returncode}\n"
                        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n--- journal\n{journal}")
        walk.ran.append(f"{step.line}: {command}" + ("" if command == typed else f"   (for `{cmd}`)"))
        walk.outputs[cmd] = proc.stdout + proc.stderr
        return proc.stdout + proc.stderr

    # ---- installing
    if cmd.startswith("sudo apt-get install dpkg-dev"):
        # the guide's own package names, installed (scripts/prereqs.txt has them), no network
        run("dpkg-query -W" + cmd.split(" install", 1)[1].split("#", 1)[0])
        return
    if cmd.startswith("packaging/build-deb"):
        walk.ran.append(f"{step.line}: {cmd}   (by the deb fixture, cached by source digest: "
                        f"{walk.deb.name})")
        return
    if cmd.startswith("sudo apt-get install ./packaging/out/"):
        run(typed, input="")
        assert (ETC / "qwen.yaml").is_file()
        return
    if cmd.startswith(("apt-get purge", "sudo scripts/install.sh", "sudo scripts/uninstall.sh")):
        walk.deferred.append(step)  # the end of the walk: purge, then the package-less install
        return
    if cmd.startswith("scripts/install.sh --add-model"):
        skip("package-less install: refused while the package is installed; test_systemd.py runs install.sh")
        return
    # ---- the dry run on the simulator
    if cmd.startswith("sudo sglang-model add sim"):
        for port in GUIDE_PORTS:
            assert port_free(port), f"port {port} (named by OPERATIONS.md) is busy on this host"
    if cmd.startswith("journalctl -u sglang-sim EVENT=profile.fallback"):
        # "uncomment SGLANG_SIM_FAULTS ... and start it again"
        sim = ETC / "sim.yaml"
        sim.write_text(sim.read_text().replace("# SGLANG_SIM_FAULTS:", "SGLANG_SIM_FAULTS:"))
        run("systemctl restart sglang-sim")
        out = run()
        assert "no-prefill-graph" in out, out
        return
    # ---- editors
    if cmd.startswith("sudo systemctl edit sglang-qwen"):
        assert step.dropin, "the block shows what to type into the drop-in"
        key = ETC / "qwen.key"
        key.write_text("walk-api-key\n")
        key.chmod(0o600)
        box.run("mkdir", "-p", "/etc/systemd/system/sglang-qwen.service.d")
        dropin = Path("/etc/systemd/system/sglang-qwen.service.d/override.conf")
        dropin.write_text("\n".join(step.dropin) + "\n")
        run("systemctl daemon-reload")
        # "with engine.api_key_credential: api-key in the YAML", and the GPU stand-in of this section
        if credentials_work(box, key):
            walk.edit_yaml(ETC / "qwen.yaml", lambda c: (c["engine"].update(api_key_credential="api-key"),
                                                         gpu_stand_in(c)))
        else:
            walk.edit_yaml(ETC / "qwen.yaml", gpu_stand_in)
            walk.not_run.append(f"{step.line}: engine.api_key_credential: api-key  -- this systemd cannot "
                                "hand a User= service its credentials (see credentials_work)")
        return
    if cmd.startswith(("sudo sh -c 'umask 077; openssl rand",
                       "sudo scp -p /etc/sglang-supervisor/group.secret")):
        skip("a multi-node group's secret: needs a second node (test_multinode.py, test_groupsecret.py)")
        return
    if cmd.startswith("systemctl edit sglang-llama"):
        skip("opens an editor; a drop-in written by hand is walked in section 2")
        return
    if cmd.startswith("sudoedit /etc/sglang-supervisor/llama.yaml"):
        def llama(c: dict[str, Any]) -> None:
            gpu_stand_in(c)
            c["engine"].update(port=free_port(), log_file="/var/log/sglang-supervisor/llama-engine.log")
            c["metrics"]["address"] = f"127.0.0.1:{free_port()}"
        walk.edit_yaml(ETC / "llama.yaml", llama)  # the fields the comment names
        walk.ran.append(f"{step.line}: {cmd}   (edited: engine.model_path, port, metrics.address, log_file)")
        return
    # ---- placeholders and patterns
    if "|" in cmd.split()[1] or "<" in cmd:
        skip("a pattern of commands, not one command")
        return
    if cmd.startswith("sglang-supervisor logscan FILE"):
        run("sglang-supervisor logscan /var/log/sglang-supervisor/qwen-engine.log")
        return
    if "check --config FILE" in re.sub(r"\s+", " ", cmd):
        run("sglang-supervisor check --config /etc/sglang-supervisor/qwen.yaml")
        return
    if "--config ..." in cmd:  # "the configuration" in prose: the one the guide edits
        run(typed.replace("--config ...", "--config /etc/sglang-supervisor/qwen.yaml"))
        return
    if cmd == "systemd-analyze security --offline=yes":
        out = run("systemd-analyze security --offline=yes --no-pager /lib/systemd/system/sglang-qwen.service")
        assert "Overall exposure level for sglang-qwen.service: 1.9" in out, out[-300:]
        return
    if cmd.startswith("journalctl") and " -f" in f" {cmd} ":
        run(f"timeout 5 {typed}", rc=(124,))  # follows until interrupted
        return
    # ---- needs the NVIDIA driver or is not a one-shot command
    if cmd.startswith(("nvidia-smi", "systemd-run")) or cmd.endswith("nvidia-smi"):
        skip("needs the NVIDIA driver: no GPU on the system tier")
        return
    if cmd.startswith("grep nvidia /proc/devices"):
        run(rc=(0, 1))  # 1 here: no NVIDIA driver loaded
        return
    if cmd.startswith("sglang-supervisor run"):
        skip("a second supervisor in the foreground beside the running unit")
        return
    # ---- state the guide assumes
    if cmd.startswith("systemctl reset-failed sglang-qwen") and box.prop(
            "sglang-qwen.service", "ActiveState") == "inactive":
        # an inactive unit nothing pulls in (the sandbox boots no multi-user.target) is unloaded;
        # the guide means a loaded unit after a start-limit-hit
        run("systemctl start sglang-qwen")
    if step.section.startswith("4.") and box.prop("sglang-qwen.service", "ActiveState") != "active":
        run("systemctl start sglang-qwen")  # section 3 ended with a stop; section 4 watches a server
    if cmd.startswith("systemctl start sglang-supervisor@llama"):
        run("systemctl stop sglang-llama")  # the same configuration (ports) as sglang-llama
        run(typed)
        run("systemctl stop sglang-supervisor@llama")
        return
    # ---- everything else: as written
    out = run()
    for check in CHECKS.get(cmd, ()):
        check(out)


def _contains(text: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        assert text in out, f"expected {text!r} in:\n{out[-2000:]}"
    return check


def _json_serving(out: str) -> None:
    assert json.loads(out)["phase"] == "serving", out[:500]


# What a command's output must show, where the guide says what it shows.
CHECKS: dict[str, tuple[Callable[[str], None], ...]] = {
    "systemctl status sglang-sim": (_contains('Status: "serving profile=tuned tok/s='),),
    "curl -s http://127.0.0.1:9401/status": (_json_serving,),
    "systemctl status sglang-qwen": (_contains('Status: "serving profile='),),
    "curl http://127.0.0.1:9400/metrics": (_contains("sglang_supervisor_throughput_ratio"),
                                           _contains("sglang_supervisor_fallback_level")),
    "sglang-model list": (_contains("llama\t/etc/sglang-supervisor/llama.yaml\tsglang-llama.service"),),
    "ss -ltnp 'sport = :30000'": (_contains(":30000"),),
    "journalctl -u sglang-qwen -o json": (_contains('"EVENT"'),),
}


def credentials_work(box: Sandbox, source: Path) -> bool:
    """Whether this systemd hands a User=sglang service its LoadCredential= copy. systemd 252 in the
    test sandbox cannot mount the per-unit credentials ramfs and leaves a directory only root may
    enter (on a booted host it works); the walk then leaves the credential out of the YAML and
    says so, instead of failing on the sandbox."""
    unit = "walk-credential-probe.service"
    box.write_runtime_file(f"systemd/system/{unit}", (
        "[Service]\nType=oneshot\nUser=sglang\n"
        f"LoadCredential=probe:{source}\nExecStart=/bin/sh -c 'cat \"$CREDENTIALS_DIRECTORY/probe\"'\n"))
    box.systemctl("daemon-reload")
    ok = box.run("systemctl", "start", unit, check=False).returncode == 0
    (box.root / "run/systemd/system" / unit).unlink()
    box.systemctl("daemon-reload")
    return ok


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def finish(walk: Walk) -> None:
    """The guide's purge, then its package-less install and removal."""
    for step in walk.deferred:
        typed = as_typed(step.command)
        if step.command.startswith("apt-get purge"):
            for unit in ("sglang-qwen", "sglang-llama", "sglang-sim"):
                walk.sh(f"systemctl disable --now {unit}", check=False)
            proc = walk.sh(typed, input="y\n")
            # the operator's files stay (qwen.key from section 2, llama.yaml from section 5)
            assert not (ETC / "qwen.yaml").exists()
            said = proc.stdout + proc.stderr  # apt passes the maintainer scripts' output on stdout
            assert "kept /etc/sglang-supervisor: it holds files you added: llama.yaml qwen.key" in said, said
            walk.ran.append(f"{step.line}: {typed}")
        elif "install.sh" in typed:
            walk.sh(typed, timeout=900)
            walk.ran.append(f"{step.line}: {typed}")
        elif "uninstall.sh" in typed:
            walk.sh(typed)
            walk.sh(f"{typed} --purge")
            walk.ran.append(f"{step.line}: {typed} (then --purge, to leave the host clean)")


def settle_dpkg(wait_s: float = 600) -> None:
    """Finish what an earlier dpkg left, as apt tells the operator to: a host whose dpkg was
    interrupted ("dpkg was interrupted, you must manually run 'dpkg --configure -a'", seen on a CI
    machine before any test had run dpkg) or is busy (an unattended upgrade holding the lock) is not
    the clean host the walk starts on, and the guide's `apt-get install` would fail on it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:  # a conffile question would wait for ever: answered by the force options, stdin closed
            proc = subprocess.run(["dpkg", "--configure", "-a", "--force-confdef", "--force-confold"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=wait_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dpkg --configure -a did not finish in {wait_s:.0f} s on this host")
        if proc.returncode == 0:
            return
        if "lock" not in proc.stderr or time.monotonic() > deadline:
            pytest.fail(f"this host's dpkg cannot be settled (dpkg --configure -a: {proc.returncode}):\n"
                        f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        time.sleep(5)


@pytest.fixture
def clean_host(deb: Path) -> Iterator[Sandbox]:
    """A systemd of its own (the walk's journal and units must not meet the other system tests'),
    on a host without the package."""
    reason = unavailable_reason()
    require(reason is None, f"systemd sandbox unavailable: {reason}", SANDBOX_FIX)
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "sglang-supervisor"], capture_output=True,
                            text=True, check=False).stdout
    require(not status.endswith(" installed"),
            "the package is installed (another test?): the walk starts on a clean host")
    settle_dpkg()
    box = Sandbox(f"sglang-walk-{os.getpid()}")
    box.up()
    try:
        allow_service_actions(box)
        yield box
    finally:
        for unit in ("sglang-qwen", "sglang-llama", "sglang-sim", "sglang-supervisor@llama"):
            box.run("systemctl", "disable", "--now", unit, check=False)
        box.run("dpkg", "--purge", "sglang-supervisor", check=False, timeout=300)
        box.run(str(REPO / "scripts" / "uninstall.sh"), "--purge", check=False, timeout=300)
        box.down()
        with contextlib.suppress(OSError):
            Path("/etc/systemd/system/sglang-qwen.service.d/override.conf").unlink()
            Path("/etc/systemd/system/sglang-qwen.service.d").rmdir()
        for name in ("qwen.key", "llama.yaml", "sim.yaml"):
            (ETC / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            ETC.rmdir()


def test_guide_commands_are_extracted_in_order() -> None:
    steps = extract(GUIDE.read_text())
    commands = [s.command for s in steps]
    assert commands.index("sudo apt-get install ./packaging/out/sglang-supervisor_*.deb") < commands.index(
        "sudo systemctl start sglang-qwen")
    edit = next(s for s in steps if s.command == "sudo systemctl edit sglang-qwen")
    assert edit.dropin == ["[Service]", "LoadCredential=api-key:/etc/sglang-supervisor/qwen.key"]
    assert "systemctl stop" not in commands and "sglang-model" not in commands  # names, not commands
    assert len(steps) > 40


def test_operations_guide_walked_top_to_bottom(clean_host: Sandbox, deb: Path, tmp_path: Path) -> None:
    walk = Walk(clean_host, deb, tmp_path)
    for step in extract(GUIDE.read_text()):
        run_step(walk, step)
    finish(walk)
    print("\nOPERATIONS.md walk: ran", len(walk.ran), "commands:")
    print("\n".join(f"  {r}" for r in walk.ran))
    print("not run:")
    print("\n".join(f"  {n}" for n in walk.not_run))
    assert len(walk.ran) > 40
