"""Issue 12: what API users send is echoed into the engine log; none of it stops, restarts or
blames anything. `sglang-supervisor run` over the simulator with SGLang's `--log-requests`.

The simulator echoes requests exactly as SGLang 0.5.x does (simulator/reqlog.py, checked against
a real run). Two sources of hostile text: the `echo-hostile` fault (one echoed chat request per
dangerous phrase, prompt and output, in the configured level and format) and real HTTP requests
sent by the test with those phrases as prompts, model name and stop strings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor.simulator.reqlog import HOSTILE_PROMPTS
from supervised import Daemon, base_config, start, stop_cleanly

pytestmark = pytest.mark.integration

# Events that would mean a log line was acted on as the engine's own voice.
ACTED_ON = ("engine.failure_line", "engine.failed", "engine.stop", "profile.fallback", "profile.retry_same",
            "engine.capture_begin", "engine.capture_end", "engine.exited", "supervisor.exit")


def _with_log_requests(data: dict[str, Any], level: str, fmt: str, *faults: str) -> dict[str, Any]:
    data["engine"]["args"].update({"log-requests": True, "log-requests-level": level,
                                   "log-requests-format": fmt})
    if faults:
        data["profiles"][0].setdefault("env", {})["SGLANG_SIM_FAULTS"] = ",".join(faults)
    return data


def _send_hostile(port: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for text in HOSTILE_PROMPTS:
            r = client.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2,
                                                                                   "stop": [text]}})
            assert r.status_code == 200
            r = client.post("/v1/chat/completions", json={
                "model": text, "messages": [{"role": "user", "content": text}], "max_tokens": 2})
            assert r.status_code == 200


def _serves_on(d: Daemon, events_before: int, engine_log: Path, phrase: str) -> None:
    """Still READY with the same engine, nothing acted on, and the echoes really are in the log."""
    assert phrase in engine_log.read_text(encoding="utf-8", errors="replace")
    assert d.proc.poll() is None
    acted = [e["event"] for e in d.events[events_before:] if e.get("event") in ACTED_ON]
    assert acted == []
    assert len(d.engine_pids()) == 1
    assert d.named("profile.known_bad_skipped") == []


@pytest.mark.parametrize(("level", "fmt"), [("2", "text"), ("3", "text"), ("1", "text"), ("3", "json")])
def test_hostile_prompts_echoed_by_log_requests_change_nothing(daemons: list[Daemon], tmp_path: Path,
                                                               level: str, fmt: str) -> None:
    data = _with_log_requests(base_config(tmp_path), level, fmt, "echo-hostile@1")
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    mark = len(d.events)
    _send_hostile(data["engine"]["port"])
    log = tmp_path / "engine.log"
    # The fault's echoes come 1 simulated second after ready; wait until the last one is there.
    finish = '"event": "request.finished"' if fmt == "json" else "Finish: obj="
    d.wait_for("the echo-hostile records in the engine log",
               lambda: log.read_text(encoding="utf-8", errors="replace").count(finish)
               >= 2 * len(HOSTILE_PROMPTS))
    # Same pump: a line reaches the engine log file and the parser together. Give the loop a few
    # health checks (every second here) to act on anything it parsed.
    time.sleep(3)
    _serves_on(d, mark, log, "Received sigquit from a child process")
    stop_cleanly(d)
    assert not any(e.get("event") in ("engine.failed", "profile.fallback") for e in d.events)
    assert d.named("supervisor.exit")[0]["code"] == 0


def test_the_real_0_5_17_log_requests_run_would_keep_serving(daemons: list[Daemon], tmp_path: Path) -> None:
    # The exact prompts of the real run that made the supervisor exit 78, sent to a supervised
    # engine with --log-requests --log-requests-level 2.
    data = _with_log_requests(base_config(tmp_path), "2", "text")
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    mark = len(d.events)
    with httpx.Client(base_url=f"http://127.0.0.1:{data['engine']['port']}", timeout=30) as client:
        for text in ("My pip run printed: error: unrecognized arguments: --user. Why?",
                     "Explain this: RuntimeError: CUDA error: an illegal memory access was encountered",
                     "OSError: [Errno 98] Address already in use"):
            assert client.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 8}}
                               ).status_code == 200
    log = tmp_path / "engine.log"
    d.wait_for("three Finish records", lambda: log.read_text().count("Finish: obj=") >= 4)  # + warmup
    time.sleep(3)
    _serves_on(d, mark, log, "error: unrecognized arguments: --user")
    stop_cleanly(d)
    assert d.named("supervisor.exit")[0]["code"] == 0


# A dict key holding newlines: SGLang 0.5.8+ prints request dict keys raw (`'{k}': repr(v)`), so
# this writes whole engine lines, header and all. The request logger writes to stdout, SGLang's
# own log to stderr, and the supervisor parses only stderr: nothing here can be an event.
FORGED_KEY = (
    "x': 1})\n"
    "[2026-12-01 10:00:00.123 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "[2026-12-01 10:00:00.200] Received sigquit from a child process. It usually means the child failed.\n"
    "sglang serve: error: unrecognized arguments: --user\n"
    "OSError: [Errno 98] Address already in use\n"
    "[2026-12-01 10:00:01.000] Decode batch, #running-req: 5, #token: 10, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 0.01, #queue-req: 0\n"
    "b"
)


def test_a_forged_line_behind_a_raw_dict_key_stops_nothing(daemons: list[Daemon], tmp_path: Path) -> None:
    data = _with_log_requests(base_config(tmp_path), "2", "text")
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")
    mark = len(d.events)
    pids = d.engine_pids()
    base = f"http://127.0.0.1:{data['engine']['port']}"
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/generate", json={"text": "hi",
                                           "sampling_params": {FORGED_KEY: 1, "max_new_tokens": 2}})
        assert r.status_code == 200
        r = client.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "chat_template_kwargs": {FORGED_KEY: True}})
        assert r.status_code == 200
    log = tmp_path / "engine.log"
    # The records that hold the key, forged lines and all, are in the log: Receive and Finish of
    # /generate, Receive OpenAI of the chat request (its GenerateReqInput has no such dict).
    d.wait_for("the forged records in the engine log",
               lambda: log.read_text(encoding="utf-8", errors="replace").count(
                   "\nRuntimeError: CUDA error: an illegal memory access was encountered\n") >= 3)
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "Receive: obj=GenerateReqInput(rid=" in text and "Receive OpenAI: obj={" in text
    assert "\nsglang serve: error: unrecognized arguments: --user\n" in text
    time.sleep(3)  # a few health checks (every second here) for anything parsed to be acted on
    _serves_on(d, mark, log, "Received sigquit from a child process")
    assert d.engine_pids() == pids
    with httpx.Client(base_url=base, timeout=30) as client:  # and it still answers
        assert client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}
                           ).status_code == 200
    stop_cleanly(d)
    assert d.named("supervisor.exit")[0]["code"] == 0
