"""A reload's changed profiles put to the installed SGLang's own parser (shell/reloadcheck.py),
with a stand-in `sglang` whose parser is stricter than the catalogue, so only the real-parser path
can find what it refuses (the compat tier runs the real parsers)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from sglang_supervisor.core.config import parse_config
from sglang_supervisor.shell import reloadcheck
from sglang_supervisor.shell.engineproc.preflight import Prepared, prepare


def config_text(python: str, max_running: int) -> str:
    return f"""
engine:
  command: [{python}, -m, sglang.launch_server]
  model_path: /models/m
  version: "0.5.23"
profiles:
  - name: tuned
    args: {{max-running-requests: {max_running}}}
  - name: eager
    args: {{max-running-requests: 16, disable-cuda-graph: true}}
"""


def fake_engine_python(tmp_path: Path, flags: set[str]) -> str:
    """An interpreter whose sglang parser knows `flags` (strings) and allows
    --max-running-requests only from {16, 32}: stricter than the catalogue on purpose."""
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    adds = "".join(f"        p.add_argument({f!r})\n" for f in sorted(flags)
                   if f not in ("--max-running-requests", "--disable-cuda-graph"))
    (site / "sglang" / "srt" / "server_args.py").write_text(
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(p):\n" + adds
        + "        p.add_argument('--max-running-requests', type=int, choices=[16, 32])\n"
        + "        p.add_argument('--disable-cuda-graph', action='store_true')\n")
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def prepared(python: str, max_running: int) -> Prepared:
    return prepare(parse_config(config_text(python, max_running)), "0.5.23")


def test_only_changed_profiles_are_asked_and_a_refusal_is_a_config_problem(tmp_path: Path) -> None:
    python = str(tmp_path / "python3")
    old = prepared(python, 16)
    flags = {t for rc in old.renders.values() for t in rc.argv if t.startswith("--")}
    fake_engine_python(tmp_path, flags)
    new = prepared(python, 64)  # the catalogue accepts 64; this "release" does not
    names = reloadcheck.changed_profiles(old, new)
    assert names == ["tuned"]
    problems, why_not = reloadcheck.real_parser_problems(new, names, {})
    assert why_not is None
    [p] = problems
    assert p.path == "profiles.tuned" and "invalid choice" in p.problem and "64" in p.problem
    # the same reload with an accepted value: nothing to refuse
    ok, why_not = reloadcheck.real_parser_problems(prepared(python, 32), ["tuned"], {})
    assert ok == [] and why_not is None


def test_a_parser_that_cannot_run_leaves_the_catalogues_verdict(tmp_path: Path) -> None:
    new = prepared(str(tmp_path / "no-such-python"), 64)
    problems, why_not = reloadcheck.real_parser_problems(new, ["tuned"], {})
    assert problems == [] and why_not is not None and "does not exist" in why_not
    assert reloadcheck.real_parser_problems(new, [], {}) == ([], None)  # nothing changed: not run
