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
from sglang_supervisor.core.gpufacts import GpuInfo, GpuProcess, engine_gpus
from sglang_supervisor.core.statusview import ROW_KEYS, duration, model_row, table
from sglang_supervisor.shell.files.codestamp import code_stamp

DOC = {"phase": "serving", "profile": "no-prefill-graph", "tok_s": 398.12,
       "below_best_profile_seconds": 7300.0, "code_stale": True,
       "attempts": [{"profile": "tuned", "failure_class": "capture_oom"},
                    {"profile": "no-prefill-graph", "failure_class": None}],
       "gateway": {"registered": False}, "throughput": {"baseline_tps": 450.0, "ratio": 0.885}}
FULL = {**DOC,
        "attempts": [{"profile": "tuned", "failure_class": "capture_oom",
                      "failure_line": "torch.OutOfMemoryError: CUDA out of memory"},
                     {"profile": "no-prefill-graph", "failure_class": None, "failure_line": None}],
        "way_back": {"last_good": "no-prefill-graph", "probation": None, "backoff": {"tuned": "capture_oom"},
                     "retry_at": {"tuned": 1000.0 + 3 * 86400}},
        "gpus": [{"index": 0, "name": "H200", "engine_bytes": 120 << 30, "memory_used_bytes": 130 << 30,
                  "memory_total_bytes": 141 << 30}]}


def test_a_fallen_back_model_shows_its_best_profile_failure_gateway_and_stale_code() -> None:
    row = model_row("qwen", "sglang-qwen.service", "active", DOC, problem=None, best="tuned")
    assert row["on_best"] is False
    assert row["last_failure"] == {"profile": "tuned", "failure_class": "capture_oom", "line": None}
    assert row["gateway_registered"] is False and row["code_stale"] is True
    text = table([row], 1000.0)
    assert "no-prefill-graph (best: tuned)" in text and "398.1" in text and "2.0 h" in text
    assert "capture_oom (tuned)" in text and "not registered" in text and "STALE" in text


def test_the_row_has_baseline_failure_line_way_back_and_gpu_memory() -> None:
    row = model_row("qwen", "sglang-qwen.service", "active", FULL, problem=None, best="tuned")
    assert row["baseline_tok_s"] == 450.0 and row["tok_s_ratio"] == 0.885
    assert row["last_failure"]["line"] == "torch.OutOfMemoryError: CUDA out of memory"
    assert row["way_back"] == {"last_good": "no-prefill-graph", "probation": None,
                               "retry_at": {"tuned": 1000.0 + 3 * 86400}}
    assert row["gpus"] == [{"index": 0, "engine_bytes": float(120 << 30),
                            "memory_used_bytes": float(130 << 30), "memory_total_bytes": float(141 << 30)}]
    text = table([row], 1000.0)
    assert "88% of 450.0" in text and "0:130/141 GiB" in text
    assert "qwen: capture_oom: torch.OutOfMemoryError: CUDA out of memory" in text
    assert "qwen: way back: next tries: tuned in 3.0 d" in text
    odd = model_row("x", "u", "active", {"way_back": {"retry_at": {"a": "soon"}},
                                         "gpus": [{"index": "0"}, 3]}, problem=None, best="tuned")
    assert odd["way_back"] == {"last_good": None, "probation": None, "retry_at": {}} and odd["gpus"] == []


def test_odd_documents_show_as_unknown_not_a_traceback() -> None:
    row = model_row("x", "u", "active", {"profile": 3, "tok_s": "fast", "attempts": "no", "gateway": [1]},
                    problem=None, best="tuned")
    assert [row[k] for k in ("profile", "tok_s", "last_failure", "gateway_registered")] == [None] * 4
    down = model_row("y", "u", "active", None, problem="no /status: refused", best="tuned")
    assert "unreachable" in table([down], 1000.0) and "y: no /status: refused" in table([down], 1000.0)


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (30, "30 s"), (600, "10 min"), (7200, "2.0 h"),
                                               (3 * 86400, "3.0 d")])
def test_durations_read_at_a_glance(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@pytest.fixture
def supervisor_port() -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(FULL).encode() if self.path == "/status" else b"{}"
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
    assert all(tuple(r) == ROW_KEYS for r in rows.values())  # the JSON's keys, stable and all there
    assert ROW_KEYS == ("model", "unit", "unit_state", "reachable", "problem", "phase", "profile",
                        "best_profile", "on_best", "tok_s", "baseline_tok_s", "tok_s_ratio",
                        "below_best_seconds", "last_failure", "way_back", "gateway_registered", "gpus",
                        "code_stale")
    assert rows["qwen"]["baseline_tok_s"] == 450.0 and rows["qwen"]["gpus"][0]["index"] == 0
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


def test_status_lists_only_the_gpus_the_engine_holds_memory_on() -> None:
    def card(index: int, *pids: int) -> GpuInfo:
        return GpuInfo(index, f"GPU-{index}", "H200", "9.0", "580", 5 << 30, 141 << 30, None, None, None,
                       None, None, None, (), tuple(GpuProcess(p, 1 << 30) for p in pids))
    assert engine_gpus(None, {1}) is None
    assert engine_gpus([card(0, 10, 11, 99), card(1, 99)], {10, 11}) == [
        {"index": 0, "name": "H200", "engine_bytes": 2 << 30, "memory_used_bytes": 5 << 30,
         "memory_total_bytes": 141 << 30}]
