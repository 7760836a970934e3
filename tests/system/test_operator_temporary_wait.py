"""As an operator meets it under a real systemd with the package installed (issue 18 item 5): the
engine port is held by another program when the unit starts. The supervisor waits inside the unit
(`activating`, StatusText `waiting: port_in_use ...`, systemd restarts nothing, so the start limit
never trips) and starts the engine as soon as the port is free.

A template instance of its own (sglang-supervisor@systest-wait), so sglang-qwen's journal and
restart counts stay untouched. The file name sorts before test_systemd.py, which purges the package
at its end.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from system.sandbox import Sandbox, template_instance, unit_demo_config

pytestmark = pytest.mark.system

NAME = "systest-wait"
UNIT = f"sglang-supervisor@{NAME}.service"
CONFIG = Path("/etc/sglang-supervisor") / f"{NAME}.yaml"
START_S = 120.0


def demo_config() -> dict[str, Any]:
    return unit_demo_config(NAME)


@pytest.fixture(scope="module")
def box(installed: Sandbox) -> Iterator[Sandbox]:
    with template_instance(installed, NAME) as b:
        yield b


def test_a_port_held_for_a_while_is_waited_out_inside_the_unit(box: Sandbox) -> None:
    cfg = demo_config()
    CONFIG.write_text(yaml.safe_dump(cfg, sort_keys=False))
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", cfg["engine"]["port"]))
    squatter.listen()
    try:
        box.systemctl("start", "--no-block", UNIT)
        try:
            box.wait_for("StatusText 'waiting: port_in_use'",
                         lambda: box.prop(UNIT, "StatusText").startswith("waiting: port_in_use"), START_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{box.diagnose(UNIT)}") from None
        time.sleep(3)  # > RestartSec of the drop-in: a restart by systemd would have happened by now
        props = box.show(UNIT, "ActiveState", "NRestarts", "StatusText")
        assert props["ActiveState"] == "activating" and props["NRestarts"] == "0", box.diagnose(UNIT)
        assert props["StatusText"].startswith("waiting: port_in_use"), props
        assert box.prop(UNIT, "MainPID") != "0"
    finally:
        squatter.close()  # the port is free again: the supervisor starts the engine on its own

    box.wait_active(UNIT, START_S)
    assert box.prop(UNIT, "NRestarts") == "0"  # the supervisor waited; systemd never restarted it
    assert box.prop(UNIT, "StatusText").startswith(("ready ", "serving ")), box.diagnose(UNIT)
