"""Child processes of the simulated launcher: one scheduler per TP rank and a detokenizer.

Each child sets PDEATHSIG=SIGKILL (dies with the launcher, like SGLang's children), names itself
`sglang::scheduler_TP{n}` / `sglang::detokenizer` (argv and, truncated to 15 bytes, the comm
name), ignores SIGTERM/SIGINT (the launcher decides how the engine stops), runs its startup
script writing straight to the inherited stderr, reports `ready` on stdout, then blocks on stdin
until the launcher closes it or dies: no CPU while idle. While serving, the TP0 scheduler echoes
the launcher's heartbeats, so that stopping it (SIGSTOP) freezes decoding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from sglang_supervisor.simulator import args as simargs
from sglang_supervisor.simulator import logfmt, startup
from sglang_supervisor.simulator.args import SimConfig

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1
ENV_ROLE = "SGLANG_SIM_CHILD_ROLE"
ENV_ARGV = "SGLANG_SIM_CHILD_ARGV"


def _prctl(option: int, arg: int | bytes) -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: names and parent-death signals are best effort


def become_child(name: str, parent_pid: int) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the launcher died before PDEATHSIG was armed
        os._exit(1)
    _prctl(_PR_SET_NAME, name.encode()[:15])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def spawn(role: str, name: str, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start a child: `python -m sglang_supervisor.simulator.ranks NAME` (stdin/stdout are control pipes)."""
    child_env = dict(env)
    child_env[ENV_ROLE] = role
    child_env[ENV_ARGV] = json.dumps(list(argv))
    child_env["SGLANG_SIM_PARENT_PID"] = str(os.getpid())
    return subprocess.Popen(
        [sys.executable, "-m", "sglang_supervisor.simulator.ranks", name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env,
        close_fds=True,
    )


def _write(text: str) -> None:
    data = text.encode()
    while data:
        n = os.write(2, data)
        data = data[n:]


def _idle_until_parent_closes() -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass


def _echo_until_parent_closes() -> None:
    """Serving: answer each heartbeat byte of the launcher. The launcher's batch loop waits for
    the answer, so a stopped scheduler (SIGSTOP) freezes decoding as it does in SGLang, while the
    HTTP server (the launcher) goes on answering."""
    try:
        while data := os.read(0, 4096):
            os.write(1, data)
    except OSError:
        pass


def run_steps(cfg: SimConfig, rank: int, steps: Sequence[startup.Step]) -> int:
    ms = os.environ.get("SGLANG_LOG_MS", "").lower() in ("1", "true", "yes")
    prefix = logfmt.rank_prefix(rank, cfg.tp_size)
    scale = cfg.sim.time_scale
    for step in steps:
        if step.kind == "log":
            _write(logfmt.line(step.text, time.time(), ms=ms, prefix=prefix))
        elif step.kind == "raw":
            _write(step.text)
        elif step.kind == "sleep":
            time.sleep(step.seconds * scale)
        elif step.kind == "sigquit":
            os.kill(os.getppid(), signal.SIGQUIT)
            _idle_until_parent_closes()
            return 0
        elif step.kind == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        elif step.kind == "hang":
            _idle_until_parent_closes()
            return 0
        elif step.kind == "ready":
            sys.stdout.buffer.write(b"ready\n")
            sys.stdout.buffer.flush()
            _echo_until_parent_closes()
            return 0
    return 0


def main() -> int:
    role = os.environ.get(ENV_ROLE, "")
    name = sys.argv[1] if len(sys.argv) > 1 else "sglang::child"
    become_child(name, int(os.environ.get("SGLANG_SIM_PARENT_PID", os.getppid())))
    if role == "detokenizer":
        _idle_until_parent_closes()
        return 0
    rank = int(role.removeprefix("scheduler_TP"))
    cfg = simargs.load_config(json.loads(os.environ[ENV_ARGV]), os.environ)
    faults = tuple(f for f in simargs.active_faults(cfg))
    return run_steps(cfg, rank, startup.rank_script(cfg, rank, faults))


if __name__ == "__main__":
    sys.exit(main())
