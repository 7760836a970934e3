"""`sglang-supervisor demo`: a prefill capture fault on the first profile falls back and reaches READY."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_fault_falls_back_and_sends_ready_within_a_minute() -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="sn-", dir="/tmp"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_dir / "n"))
    sock.settimeout(0.5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM")}
    env.update({"NOTIFY_SOCKET": str(sock_dir / "n"), "SGLANG_SIM_TIME_SCALE": "0.02"})
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_supervisor", "demo", "--fault", "capture-fail:prefill:error",
         "--exit-after-ready", "--json-summary", "--metrics-address", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    notes: list[str] = []
    ready_at = None
    try:
        while proc.poll() is None and time.monotonic() - began < 90:
            try:
                notes += sock.recv(65536).decode().splitlines()
            except TimeoutError:
                continue
            if ready_at is None and "READY=1" in notes:
                ready_at = time.monotonic() - began
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        sock.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert proc.returncode == 0, out[-3000:]
    assert ready_at is not None and ready_at < 60, (ready_at, notes, out[-3000:])
    assert "STOPPING=1" in notes
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ready"] is True
    assert summary["profile"] == "no-prefill-graph"
    first, second = summary["attempts"][:2]
    assert (first["profile"], first["outcome"], first["failure_class"]) == (
        "tuned", "failed", "prefill_graph_failed")
    assert (second["profile"], second["outcome"]) == ("no-prefill-graph", "ready")
    assert all(a["seconds"] >= 0 for a in summary["attempts"])
    # the console narrates the lifecycle: launch, captures, fallback, ready
    for step in ("engine.launch", "engine.capture_end", "profile.fallback", "supervisor.ready"):
        assert step in out
