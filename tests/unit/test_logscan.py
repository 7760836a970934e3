"""`logscan` end to end through the CLI entry point."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from sglang_supervisor import cli

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.17-h200"
KEYS = {"file", "ready", "phase", "tp_size", "capture", "failure", "crashed", "last_gen_throughput",
        "last_input_throughput", "decode_cuda_graph"}


def test_json_one_object_per_file(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(FIX / "graphs.log"), str(FIX / "failures" / "prefill_capture_oom.log")]
    assert cli.main(["logscan", "--json", *files]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["file"] for r in rows] == files
    assert all(set(r) == KEYS for r in rows)
    assert set(rows[0]["capture"]) == {"began", "completed", "failed", "events"}
    assert set(rows[0]["capture"]["events"][0]) == {"kind", "state", "rank", "elapsed_s"}
    assert rows[0]["ready"] is True
    assert rows[1]["failure"] == {"class": "prefill_graph_failed", "line": 24,
                                  "message": "Fail when using backend: breakable for prefill runner."}


def test_human_report_explains_the_failure(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["logscan", str(FIX / "failures" / "draft_extend_capture_import_error.log")]) == 0
    out = capsys.readouterr().out
    assert "NOT READY" in out
    assert "draft_capture_failed at line 228" in out
    assert "No module named 'deep_gemm'" in out
    assert "without speculative decoding" in out
    assert "draft decode: done in 2.98 s" in out


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = (FIX / "failures" / "kv_oom.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert cli.main(["logscan", "--json", "-"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["file"] == "-"
    assert row["failure"]["class"] == "kv_cache_oom"


def test_unreadable_file_exits_1_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.log"
    assert cli.main(["logscan", str(missing), str(FIX / "eager.log")]) == 1
    captured = capsys.readouterr()
    assert f"cannot read {missing}: No such file or directory" in captured.err
    assert "eager.log: READY" in captured.out
    assert "Traceback" not in captured.err


def test_api_key_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "k.log"
    log.write_text("[2026-05-01 12:00:00] server_args={'api_key': 'sk-live-1'}\n"
                   "[2026-05-01 12:00:01] Scheduler hit an exception: Traceback (most recent call last):\n"
                   "RuntimeError: bad request with api_key='sk-live-1'\n")
    assert cli.main(["logscan", "--json", str(log)]) == 0
    out = capsys.readouterr().out
    assert "sk-live-1" not in out
    assert json.loads(out)["failure"]["class"] == "scheduler_exception"
