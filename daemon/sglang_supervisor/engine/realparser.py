"""The real SGLang argument parser, asked from the supervisor: `argcheck.py` run by the engine's
own interpreter (doctor, and a reload before it drains anything)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_supervisor.core.childenv import engine_env

ARGCHECK_SCRIPT = Path(__file__).resolve().parent / "argcheck.py"
ARGCHECK_TIMEOUT_S = 120.0


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
