"""`sglang-supervisor status`: the rows it builds from /status documents (core/statusview.py) and
the command against a real HTTP listener standing in for a running supervisor."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import sglang_supervisor
from sglang_supervisor import cli
from sglang_supervisor.core.statusview import duration, model_row, table
from sglang_supervisor.shell.codestamp import code_stamp

DOC = {"phase": "serving", "profile": "no-prefill-graph", "tok_s": 398.12,
       "below_best_profile_seconds": 7300.0, "code_stale": True,
       "attempts": [{"profile": "tuned", "failure_class": "capture_oom"},
                    {"profile": "no-prefill-graph", "failure_class": None}],
       "gateway": {"registered": False}}


def test_a_fallen_back_model_shows_its_best_profile_failure_gateway_and_stale_code() -> None:
    row = model_row("qwen", "sglang-qwen.service", "active", DOC, problem=None, best="tuned")
    assert row["on_best"] is False
    assert row["last_failure"] == {"profile": "tuned", "failure_class": "capture_oom"}
    assert row["gateway_registered"] is False and row["code_stale"] is True
    text = table([row])
    assert "no-prefill-graph (best: tuned)" in text and "398.1" in text and "2.0 h" in text
    assert "capture_oom (tuned)" in text and "not registered" in text and "STALE" in text


def test_odd_documents_show_as_unknown_not_a_traceback() -> None:
    row = model_row("x", "u", "active", {"profile": 3, "tok_s": "fast", "attempts": "no", "gateway": [1]},
                    problem=None, best="tuned")
    assert [row[k] for k in ("profile", "tok_s", "last_failure", "gateway_registered")] == [None] * 4
    down = model_row("y", "u", "active", None, problem="no /status: refused", best="tuned")
    assert "unreachable" in table([down]) and "y: no /status: refused" in table([down])


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (30, "30 s"), (600, "10 min"), (7200, "2.0 h"),
                                               (3 * 86400, "3.0 d")])
def test_durations_read_at_a_glance(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@pytest.fixture
def supervisor_port() -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(DOC).encode() if self.path == "/status" else b"{}"
            self.send_response(200 if self.path == "/status" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_status_all_json_has_one_stable_object_per_model(
        tmp_path: Path, supervisor_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    base = ("engine:\n  command: [python3]\n  model_path: m\n  port: {port}\n"
            "metrics:\n  address: 127.0.0.1:{metrics}\n"
            "profiles:\n  - name: tuned\n  - name: no-prefill-graph\n")
    (tmp_path / "qwen.yaml").write_text("name: qwen\n" + base.format(port=30000, metrics=supervisor_port))
    (tmp_path / "broken.yaml").write_text("engine: [\n")
    assert cli.main(["status", "--all", "--config-dir", str(tmp_path), "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows["qwen"]["profile"] == "no-prefill-graph" and rows["qwen"]["on_best"] is False
    assert rows["qwen"]["best_profile"] == "tuned" and rows["qwen"]["code_stale"] is True
    assert rows["broken"]["reachable"] is False
    assert "sglang-supervisor check --config" in rows["broken"]["problem"]
    assert cli.main(["status", "--all", "--config-dir", str(tmp_path / "none")]) == 78


def test_the_code_stamp_changes_when_an_upgrade_rewrites_the_installed_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "__init__.py").write_text("old\n")
    (tmp_path / "cli.py").write_text("old\n")
    monkeypatch.setattr(sglang_supervisor, "__file__", str(tmp_path / "__init__.py"))
    before = code_stamp()
    assert code_stamp() == before  # nothing changed: current
    (tmp_path / "cli.py").unlink()
    (tmp_path / "cli.py").write_text("the new release\n")  # a new file, as an unpacked package is
    assert code_stamp() != before
