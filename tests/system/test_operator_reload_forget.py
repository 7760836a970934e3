"""As an operator types it, under a real systemd with the package installed (issue 18 items 2
and 4): `systemctl reload` fails on a broken configuration (the unit's ExecReload runs `check`
first) and the engine keeps serving; a reload the supervisor cannot apply shows up in `systemctl
status`; `sglang-supervisor forget --profile P` (as root) makes the next start try P again,
and the state file stays the service user's.

A template instance of its own (sglang-supervisor@systest-ops), so the journal and restart counts
of sglang-qwen that test_systemd.py checks stay untouched. Runs before test_systemd.py (which
purges the package at its end): the file name sorts first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from system.sandbox import Sandbox, free_port, template_instance, unit_demo_config

pytestmark = pytest.mark.system

NAME = "systest-ops"
UNIT = f"sglang-supervisor@{NAME}.service"
CONFIG = Path("/etc/sglang-supervisor") / f"{NAME}.yaml"
STATE = Path("/var/lib/sglang-supervisor") / f"{NAME}.state.json"
START_S = 120.0
# tuned's prefill graph capture fails (the simulator's fault, matching only tuned's command line);
# in a drop-in, so the configuration and its fingerprint stay the same when it is removed
FAULT_DROPIN = """[Service]
Environment=SGLANG_SIM_FAULTS=capture-fail:prefill:error+when=--enable-single-batch-overlap
"""


def demo_config() -> dict[str, Any]:
    cfg = unit_demo_config(NAME)
    cfg["restart"].update(known_bad_ttl_s=7 * 86400)
    return cfg


def write(cfg: dict[str, Any]) -> None:
    CONFIG.write_text(yaml.safe_dump(cfg, sort_keys=False))


def engine_pids(box: Sandbox) -> list[int]:
    main = int(box.prop(UNIT, "MainPID") or 0)
    return [p for p in box.unit_pids(UNIT) if p != main]


def cursor(box: Sandbox) -> str:
    entries = box.journal("-n", "1")
    return str(entries[-1]["__CURSOR"]) if entries else ""


def named(box: Sandbox, event: str, since: str) -> list[dict[str, Any]]:
    return [e for e in box.journal(f"--after-cursor={since}", unit=UNIT) if e.get("EVENT") == event]


@pytest.fixture(scope="module")
def box(installed: Sandbox) -> Iterator[Sandbox]:
    with template_instance(installed, NAME) as b:
        yield b


def test_systemctl_reload_fails_on_a_broken_config_and_the_engine_serves_on(box: Sandbox) -> None:
    cfg = demo_config()
    write(cfg)
    box.systemctl("start", UNIT, timeout=START_S)
    box.wait_active(UNIT, START_S)
    main, engines = box.prop(UNIT, "MainPID"), engine_pids(box)
    assert engines

    CONFIG.write_text(CONFIG.read_text().replace("profiles:", "profiles: [oops", 1))
    reload = box.run("systemctl", "reload", UNIT, check=False, timeout=60)
    assert reload.returncode != 0, reload  # the operator's command fails, not the server
    status = box.systemctl("status", UNIT, check=False)
    assert re.search(r"ExecReload=.*check (--alone )?--config .*status=78", status), status
    assert box.prop(UNIT, "ActiveState") == "active"
    assert box.prop(UNIT, "MainPID") == main and engine_pids(box) == engines
    report = " ".join(str(e.get("MESSAGE", "")) for e in box.journal(unit=UNIT))
    assert "YAML syntax error" in report  # check's report, in the unit's journal

    # valid, but a key a reload cannot apply: the reload is refused and Status: says why
    moved = {**cfg, "metrics": {**cfg["metrics"], "address": f"127.0.0.1:{free_port()}"}}
    write(moved)
    mark = cursor(box)
    box.systemctl("reload", UNIT, timeout=60)
    box.wait_for("the refusal in StatusText",
                 lambda: "reload refused: metrics.address changed" in box.prop(UNIT, "StatusText"), 60)
    [refused] = named(box, "supervisor.reload_failed", mark)
    assert refused["KIND"] == "not_applicable" and refused["PRIORITY"] == "3"
    assert "reload refused" in box.systemctl("status", UNIT, check=False)
    assert box.prop(UNIT, "MainPID") == main and engine_pids(box) == engines

    # back to the running file: applied, the note is gone
    write(cfg)
    box.systemctl("reload", UNIT, timeout=60)
    box.wait_for("StatusText without the note",
                 lambda: "reload refused" not in box.prop(UNIT, "StatusText"), 60)
    assert box.prop(UNIT, "StatusText").startswith("serving profile=tuned")
    box.systemctl("stop", UNIT, timeout=90)


def test_forget_makes_the_next_start_try_the_profile_again(box: Sandbox) -> None:
    cfg = demo_config()
    write(cfg)
    box.dropin(UNIT, "60-fault", FAULT_DROPIN)
    box.systemctl("start", UNIT, timeout=START_S)
    box.wait_active(UNIT, START_S)
    assert box.prop(UNIT, "StatusText").startswith("serving profile=no-prefill-graph")
    box.systemctl("stop", UNIT, timeout=90)
    state = json.loads(STATE.read_text())
    assert [p for fp in state["fingerprints"].values() for p in fp["bad"]] == ["tuned"]

    # the cause is fixed (the fault removed); without forget the fallback would stay for a week
    (box.root / f"run/systemd/system/{UNIT}.d/60-fault.conf").unlink()
    box.systemctl("daemon-reload")
    owner = STATE.stat().st_uid, STATE.stat().st_gid
    out = box.run("sglang-supervisor", "forget", "--config", str(CONFIG), "--profile", "tuned").stdout
    assert f"{NAME}: forgot profile tuned" in out and "prefill_graph_failed" in out, out
    assert (STATE.stat().st_uid, STATE.stat().st_gid) == owner  # still the service user's file

    mark = cursor(box)
    box.systemctl("start", UNIT, timeout=START_S)
    box.wait_active(UNIT, START_S)
    launches = [(e["PROFILE"], e["REASON"]) for e in named(box, "engine.launch", mark)]
    assert launches == [("tuned", "probation")], launches
    assert box.prop(UNIT, "StatusText").startswith("serving profile=tuned")
    box.systemctl("stop", UNIT, timeout=90)
