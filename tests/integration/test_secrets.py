"""The API key end to end: never on argv, in logs, the engine log, /status or /metrics.

SGLang itself prints `--api-key` in its `server_args=` line and returns it from /server_info, and
the simulator does the same, so this only passes if the supervisor keeps it out of argv (0600
`--config` file) and redacts everything it writes or serves.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from supervised import Daemon, base_config, free_port, start, stop_cleanly

pytestmark = pytest.mark.integration

KEY = "sk-test-7f3a9c1e5b2d4a6f"


def _process_tree_cmdlines(root: int) -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != root:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return out


def test_api_key_never_leaks(daemons: list[Daemon], tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    data = base_config(tmp_path)
    data["engine"]["api_key_file"] = str(key_file)
    metrics_port = free_port()
    data["metrics"] = {"enabled": True, "address": f"127.0.0.1:{metrics_port}"}
    d = start(daemons, tmp_path, data)
    d.notified("READY=1")  # the ready probe authenticated with the key: it reached the engine

    engine_pid = d.engine_pids()[0]
    cmdlines = _process_tree_cmdlines(engine_pid)
    assert cmdlines and not any(KEY in c for c in cmdlines)
    assert any("--config" in c for c in cmdlines)
    secret_files = [p for p in (tmp_path / "run").iterdir() if p.is_file()]
    assert secret_files, "the API key must reach SGLang through a --config file"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in secret_files)

    port = data["engine"]["port"]
    # The engine really enforces the key (so the test would notice a key that never arrived).
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    for path in ("/status", "/metrics"):
        body = httpx.get(f"http://127.0.0.1:{metrics_port}{path}", timeout=10).text
        assert body and KEY not in body, path

    stop_cleanly(d)
    logs = "\n".join(d.raw)
    assert "server_args" in (tmp_path / "engine.log").read_text()  # the line that carries it in SGLang
    assert KEY not in logs
    assert KEY not in (tmp_path / "engine.log").read_text()
    assert not any(p.exists() for p in secret_files), "the secret --config file outlived the stop"
