"""A reload's changed commands put to the installed SGLang's own argument parser before anything
is drained (issue 28): what it refuses (an unknown flag, a wrong type, a bad choice) refuses the
reload, so the serving engine is never stopped for a command that cannot start.

The catalogue (`engine/flagcatalog.py`, checked in `preflight.prepare`) already knows every
flag, type and choice of the releases it records; the real parser also covers a release it does
not record, choices computed at runtime and a patched install. It runs in the engine's own
interpreter, once per distinct engine environment, bounded in time; when it cannot run there (no
sglang importable, the simulator, too slow) the catalogue's verdict stands and the journal says so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sglang_supervisor.core import audit
from sglang_supervisor.core.childenv import engine_env
from sglang_supervisor.core.config import ConfigProblem
from sglang_supervisor.core.profiles import base_command
from sglang_supervisor.engine.detect import engine_interpreter, is_simulator
from sglang_supervisor.engine.realparser import run_argcheck
from sglang_supervisor.shell.engineproc.preflight import Prepared

# Inside the reload's own bound (reloader.READ_TIMEOUT_S), after the version detection.
PARSER_TIMEOUT_S = 25.0

Runner = Callable[..., tuple[dict[str, Any] | None, str | None]]


def changed_profiles(old: Prepared, new: Prepared) -> list[str]:
    """Profiles whose rendered command or environment the reload changes (or adds)."""
    out: list[str] = []
    for name, rc in new.renders.items():
        was = old.renders.get(name)
        if was is None or was.argv != rc.argv or was.env != rc.env:
            out.append(name)
    return out


def real_parser_problems(new: Prepared, names: Sequence[str], environ: Mapping[str, str], *,
                         runner: Runner = run_argcheck) -> tuple[list[ConfigProblem], str | None]:
    """(what the real parser refuses in profiles `names`, why it could not be asked or None)."""
    config = new.config
    if not names:
        return [], None
    if is_simulator(config):
        return [], "the engine is the simulator (its parser is the catalogue's)"
    interpreter = engine_interpreter(config, sys.executable)
    skip = len(base_command(config, sys.executable))
    by_env: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in names:
        by_env.setdefault(tuple(sorted(new.renders[name].env.items())), []).append(name)
    problems: list[ConfigProblem] = []
    why_not: str | None = None
    for overlay, group in by_env.items():
        argvs = {name: list(new.renders[name].argv[skip:]) for name in group}
        answer, why = runner(interpreter, argvs, timeout_s=PARSER_TIMEOUT_S,
                             env=engine_env(environ, dict(overlay)))
        if answer is None:
            why_not = why
            continue
        results = answer.get("results") or {}
        version = answer.get("version")
        for name in group:
            for f in audit.parser_findings(name, results.get(name), version):
                if f.severity == "error":
                    problems.append(ConfigProblem(f"profiles.{name}", f"{f.what}: {f.why}"[:500], f.fix))
    return problems, why_not
