"""The engine's environment, computed (pure): what the supervisor's own environment, the profile's
`env` and the engine's virtual environment make of it. The shell spawns with the result."""

from __future__ import annotations

from collections.abc import Mapping

# The supervisor runs under systemd, on Linux: PATH entries are separated by ":".
PATH_SEP = ":"

# What systemd hands *us*. The engine must never see these: with NotifyAccess=all a stray
# READY=1 from SGLang (or a library it loads) would lie to systemd, and LISTEN_FDS would make
# a socket-activation-aware library grab descriptors that are not its own.
_CHILD_ENV_DROP = frozenset(
    {
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        # The engine's stdout is our log file, not the journal stream; a library that trusts this
        # variable would send to journald behind our back.
        "JOURNAL_STREAM",
    }
)
_CHILD_ENV_DROP_PREFIXES = ("LISTEN_",)  # LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES


def clean_child_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` without the variables systemd meant only for the supervisor."""
    return {
        k: v
        for k, v in env.items()
        if k not in _CHILD_ENV_DROP and not k.startswith(_CHILD_ENV_DROP_PREFIXES)
    }


def engine_env(base: Mapping[str, str], overlay: Mapping[str, str], venv_bin: str | None = None
               ) -> dict[str, str]:
    """The engine's environment: ours plus the profile's, minus systemd's notify/watchdog/fd vars.

    `venv_bin` (the engine's virtual environment's bin directory) goes first on PATH, as
    `source .venv/bin/activate` would do: SGLang JIT-compiles kernels with the `ninja` that pip
    installed beside it, and systemd's PATH does not hold that directory (measured on an H200 under
    the shipped unit: `FileNotFoundError: [Errno 2] No such file or directory: 'ninja'` while
    capturing the first CUDA graph, on every rung of the ladder)."""
    env = {**base, **overlay}
    if venv_bin:
        parts = [p for p in env.get("PATH", "").split(PATH_SEP) if p]
        if venv_bin not in parts:
            env["PATH"] = PATH_SEP.join([venv_bin, *parts])
    return clean_child_env(env)
