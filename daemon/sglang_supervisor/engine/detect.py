"""Which SGLang release the configured engine runs (`engine.version: auto`).

The engine has its own virtual environment, so the supervisor asks that interpreter rather than
importing sglang itself. The simulator answers for the release it emulates.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import VERSION, Config, ConfigError, ConfigProblem

SIMULATOR_MODULE = "sglang_supervisor.simulator"
SIMULATOR_VERSION_ENV = "SGLANG_SIM_VERSION"
SIMULATOR_DEFAULT_VERSION = "0.5.23"
_VERSION_SNIPPET = "import importlib.metadata as m; print(m.version('sglang'))"


def is_simulator(config: Config) -> bool:
    command = config.engine.command
    return SIMULATOR_MODULE in command or os.path.basename(command[0]) == "sglang-sim"


def engine_interpreter(config: Config, python: str = sys.executable) -> str:
    """engine.interpreter; else command[0] when it is a python; else the python3 beside it
    (`/opt/sglang/.venv/bin/sglang serve` -> `/opt/sglang/.venv/bin/python3`)."""
    engine = config.engine
    if engine.interpreter:
        return engine.interpreter.replace("{python}", python)
    first = engine.command[0].replace("{python}", python)
    if os.path.basename(first).startswith("python"):
        return first
    return os.path.join(os.path.dirname(first), "python3")


def simulator_version(config: Config, environ: Mapping[str, str] | None = None) -> str:
    """The release the simulator emulates: its --sim-version flag, SGLANG_SIM_VERSION, or its default."""
    env = os.environ if environ is None else environ
    flag = config.engine.args.get("sim-version")
    if isinstance(flag, str | int | float) and not isinstance(flag, bool):
        return str(flag)
    return config.engine.env.get(SIMULATOR_VERSION_ENV) or env.get(SIMULATOR_VERSION_ENV) or (
        SIMULATOR_DEFAULT_VERSION)


def _problem(problem: str, fix: str) -> ConfigError:
    return ConfigError([ConfigProblem("engine.version", problem, fix)], "engine version")


def detect_engine_version(config: Config, timeout_s: float = 30, *, python: str = sys.executable,
                          environ: Mapping[str, str] | None = None) -> str:
    """engine.version, or (auto) the sglang version installed beside the engine's interpreter,
    asked in the environment the engine gets (`environ`, default ours, plus engine.env): where
    sglang is importable only through engine.env's PYTHONPATH, so is its version."""
    version = config.engine.version
    if version != "auto":
        return version
    if is_simulator(config) and not config.engine.interpreter:
        # An explicit interpreter (an upgrade candidate's venv) is asked even for the simulator.
        return simulator_version(config)
    interpreter = engine_interpreter(config, python)
    pin = "set engine.version to the installed release (e.g. \"0.5.23\")"
    try:
        proc = subprocess.run(
            [interpreter, "-c", _VERSION_SNIPPET],
            capture_output=True, text=True, timeout=timeout_s, check=False,
            env=engine_env(os.environ if environ is None else environ, config.engine.env),
        )
    except FileNotFoundError:
        raise _problem(f"the engine interpreter {interpreter} does not exist",
                       f"point engine.command (or engine.interpreter) at SGLang's venv, or {pin}") from None
    except PermissionError:
        raise _problem(f"the engine interpreter {interpreter} is not executable by this user",
                       f"fix its permissions, or {pin}") from None
    except subprocess.TimeoutExpired:
        raise _problem(f"{interpreter} did not answer within {timeout_s:g} s",
                       f"check that interpreter by hand, or {pin}") from None
    except OSError as exc:
        raise _problem(f"cannot run {interpreter}: {exc.strerror}", pin) from None
    out = proc.stdout.strip()
    if proc.returncode != 0 or not VERSION.match(out):
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "PackageNotFoundError" in proc.stderr:
            last = "sglang is not installed there"
        raise _problem(f"{interpreter} could not tell the sglang version: {last}",
                       f"install sglang into that venv (pip install sglang), or {pin}")
    return out
