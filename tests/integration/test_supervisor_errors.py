"""A bug inside the supervisor ends the run loudly (exit 1) and never leaves the engine running.

The Supervisor runs in this process over the simulator, with one of its own steps replaced by one
that raises: a task (launch, health loop) or a loop callback (engine output fed to the lifecycle).
Without the fix, such an exception vanished into asyncio and the lifecycle waited forever.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_supervisor.core.config import parse_config
from sglang_supervisor.core.exitcodes import ExitCode
from sglang_supervisor.core.inputs import Input, Launched
from sglang_supervisor.engine.detect import detect_engine_version
from sglang_supervisor.shell.engineproc.process import group_members
from sglang_supervisor.shell.supervisor import Options, Supervisor, prepare
from supervised import DEADLINE_S, base_config

pytestmark = pytest.mark.integration


def supervisor(workdir: Path) -> tuple[Supervisor, list[int]]:
    config = parse_config(yaml.safe_dump(base_config(workdir)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC") and not k.startswith("SGLANG_SIM")}
    sup = Supervisor(prepare(config, detect_engine_version(config)), Options(environ=env))
    engines: list[int] = []
    feed = sup.feed

    def recording_feed(inp: Input) -> None:
        if isinstance(inp, Launched):
            engines.append(inp.pid)
        feed(inp)

    sup.feed = recording_feed  # type: ignore[method-assign]
    return sup, engines


def run(sup: Supervisor) -> int:
    return asyncio.run(asyncio.wait_for(sup.run(), DEADLINE_S))


def bug(*_args: Any) -> Any:
    raise RuntimeError("a bug")


async def async_bug(*_args: Any) -> None:
    raise RuntimeError("a bug")


def test_a_failing_launch_ends_the_run(tmp_path: Path) -> None:
    sup, engines = supervisor(tmp_path)
    sup.runner.spawn = bug  # type: ignore[method-assign]
    assert run(sup) == ExitCode.FAILURE
    assert engines == []


def test_a_failing_serving_task_stops_the_engine(tmp_path: Path) -> None:
    sup, engines = supervisor(tmp_path)
    sup.serving.health_loop = async_bug  # type: ignore[method-assign]  # starts at READY
    assert run(sup) == ExitCode.FAILURE
    assert sup.lifecycle.ready_sent and len(engines) == 1
    assert group_members(engines[0]) == []


def test_a_failing_loop_callback_stops_the_engine(tmp_path: Path) -> None:
    sup, engines = supervisor(tmp_path)
    sup.runner.on_output = bug  # type: ignore[method-assign]  # the engine's first output
    assert run(sup) == ExitCode.FAILURE
    assert len(engines) == 1 and group_members(engines[0]) == []
