"""A reload of a serving unit proves itself or is rolled back (issue 28.1), over the simulator:
a value SGLang's parser would refuse is refused before anything is drained; a new command that
fails before READY (a capture failure, or the engine refusing its flags) gives way to the previous
command, reported in STATUS=, /status, the journal and a metric; never exit 78.

Each test starts the real `sglang-supervisor run` as a subprocess with a NOTIFY_SOCKET it owns
(tests/supervised.py).
"""

from __future__ import annotations

import copy
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervised import Daemon, base_config, free_port, start, stop_cleanly

pytestmark = pytest.mark.integration


def with_metrics(tmp_path: Path) -> tuple[dict[str, Any], str]:
    data = base_config(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    data["metrics"] = {"enabled": True, "address": address}
    return data, address


def statuses(d: Daemon) -> list[str]:
    return [n for n in d.notes if n.startswith("STATUS=")]


def test_a_value_of_the_wrong_type_is_refused_and_the_engine_keeps_serving(
        daemons: list[Daemon], tmp_path: Path) -> None:
    data, address = with_metrics(tmp_path)
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    engine = d.engine_pids()
    bad = copy.deepcopy(data)
    bad["engine"]["args"]["max-running-requests"] = "banana"
    d.write_config(bad)
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    refused = d.event("supervisor.reload_failed", after=n)
    assert refused["kind"] == "invalid"
    assert "invalid int value 'banana'" in refused["reason"]
    d.wait_for("STATUS= naming the refused reload",
               lambda: any("reload refused" in s for s in statuses(d)))
    assert httpx.get(f"http://{address}/status", timeout=10).json()["last_reload"]["result"] == "refused"
    # nothing drained, nothing relaunched: the same engine serves
    assert d.engine_pids() == engine and d.proc.poll() is None
    assert not d.named("supervisor.reload") and not d.named("engine.launch_failed")
    stop_cleanly(d)


@pytest.mark.parametrize(
    ("change", "failure_class"),
    [
        # the new command's prefill capture fails: not down the ladder, back to what served
        ({"SGLANG_SIM_FAULTS": "capture-fail:prefill"}, "prefill_graph_failed"),
        # the engine refuses the new command's flags (argparse, rc 2) after every check passed
        # here (an engine older than engine.version says): exit 78 before issue 28
        ({"SGLANG_SIM_VERSION": "0.5.13"}, "unknown_flag"),
    ],
)
def test_a_new_command_failing_before_ready_is_rolled_back(
        daemons: list[Daemon], tmp_path: Path, change: dict[str, str], failure_class: str) -> None:
    data, address = with_metrics(tmp_path)
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    first = d.engine_pids()
    new = copy.deepcopy(data)
    new["profiles"][0].setdefault("env", {}).update(change)
    d.write_config(new)
    n = len(d.events)
    d.proc.send_signal(signal.SIGHUP)
    d.event("supervisor.reload", after=n)
    rolled = d.event("supervisor.reload_rolled_back", after=n)
    assert rolled["profile"] == "tuned" and rolled["failed_profile"] == "tuned"
    assert rolled["failure_class"] == failure_class, rolled
    d.notified("READY=1", count=2)  # the previous command serves again
    assert d.proc.poll() is None  # no exit 78: it serves (and stop_cleanly below sees exit 0)
    assert not d.named("profile.fallback")  # the ladder was not walked for the change
    status = httpx.get(f"http://{address}/status", timeout=10).json()
    assert status["last_reload"]["result"] == "rolled_back"
    assert status["last_reload"]["failure_class"] == failure_class
    d.wait_for("STATUS= naming the rollback",
               lambda: any("reload rolled back" in s for s in statuses(d)))
    metrics = httpx.get(f"http://{address}/metrics", timeout=10).text
    assert 'sglang_supervisor_config_reloads_total{result="rolled_back"} 1.0' in metrics
    assert "sglang_supervisor_config_last_reload_successful 0.0" in metrics
    assert 'sglang_supervisor_restarts_total{reason="rollback"} 1.0' in metrics
    # the relaunched engine runs the previous command: no fault, no other version in its env
    spawned = d.named("engine.spawned")
    assert len(spawned) == 3 and spawned[0]["pid"] in first
    stop_cleanly(d)
