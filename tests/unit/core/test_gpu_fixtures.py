"""The engine logs real SGLang 0.5.17 wrote under the supervisor on an H200 (scripts/gpu-e2e) read
through logwatch to the summary that matches what happened on the machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor.core.events import CaptureEnded, ServerArgsSeen, ServerReady
from sglang_supervisor.core.logwatch import parse_bytes, summarize

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200-supervised"


def events(name: str) -> list:
    return parse_bytes((FIX / name).read_bytes(), "0.5.17")


def captures(name: str) -> list[tuple[str, float | None]]:
    return [(f"{e.owner} {e.phase}", e.elapsed_s) for e in events(name) if isinstance(e, CaptureEnded)]


@pytest.mark.parametrize("name", ["first-launch-jit.engine.log", "restart.engine.log"])
def test_scheduler_kill_then_relaunch_reads_as_two_ready_attempts_and_a_child_crash(name: str) -> None:
    evs = events(name)
    s = summarize(evs)
    assert sum(isinstance(e, ServerArgsSeen) for e in evs) == 2
    assert sum(isinstance(e, ServerReady) for e in evs) == 2
    assert [c for c, _ in captures(name)] == ["target prefill", "target decode"] * 2
    assert s.failure is not None and s.failure["class"] == "child_crashed"
    assert "scheduler_0" in s.failure["message"]
    assert s.crashed and s.ready and s.decode_cuda_graph is True
    assert s.capture["completed"] and not s.capture["failed"]


def test_first_launch_prefill_capture_holds_the_jit_compile() -> None:
    first, _, relaunch, _ = captures("first-launch-jit.engine.log")
    assert first == ("target prefill", 84.49)
    assert relaunch == ("target prefill", 2.49)


def test_kv_cache_failure_then_eager_fallback() -> None:
    evs = events("fallback.engine.log")
    s = summarize(evs)
    assert s.failure is not None and s.failure["class"] == "kv_cache_oom"
    assert "--mem-fraction-static=0.0001" in s.failure["message"]
    assert sum(isinstance(e, ServerReady) for e in evs) == 1
    assert s.ready and s.decode_cuda_graph is False
    assert not s.capture["began"]


def test_hand_launch_stopped_by_sigterm_is_not_a_crash() -> None:
    s = summarize(events("hand.engine.log"))
    assert s.ready and not s.crashed and s.failure is None
    assert [c for c, _ in captures("hand.engine.log")] == ["target prefill", "target decode"]


def supervisor_events(name: str) -> list[dict]:
    # Each line: seconds since start, a space, one JSON object (non-JSON lines are kept raw).
    out = []
    for line in (FIX / name).read_text().splitlines():
        _, _, text = line.strip().partition(" ")
        try:
            out.append(json.loads(text))
        except ValueError:
            out.append({"event": "raw", "text": text})
    return out


def test_supervisor_log_orders_capture_ready_line_probe_then_ready() -> None:
    names = [d.get("event") for d in supervisor_events("restart.supervisor.log")]
    first_ready = names.index("supervisor.ready")
    assert names.index("engine.capture_end") < names.index("engine.ready") < first_ready
    assert names.count("supervisor.ready") == 2  # the relaunch after the scheduler was killed
    assert "engine.failed" in names[first_ready:]
