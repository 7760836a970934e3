"""`logscan` end to end through the CLI entry point."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from sglang_supervisor import cli

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200"
KEYS = {"file", "ready", "phase", "tp_size", "capture", "failure", "crashed", "last_gen_throughput",
        "last_input_throughput", "decode_cuda_graph", "run", "runs", "text_request_records"}


def test_json_one_object_per_file(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(FIX / "graphs.log"), str(FIX / "failures" / "prefill_capture_oom.log")]
    assert cli.main(["logscan", "--json", *files]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["file"] for r in rows] == files
    assert all(set(r) == KEYS for r in rows)
    assert set(rows[0]["capture"]) == {"began", "completed", "failed", "events"}
    assert set(rows[0]["capture"]["events"][0]) == {"kind", "state", "rank", "elapsed_s"}
    assert rows[0]["ready"] is True
    # Line numbers as `grep -n` gives them (the file's \r progress frames do not count).
    assert rows[1]["failure"] == {"class": "prefill_graph_failed", "line": 21,
                                  "message": "Fail when using backend: breakable for prefill runner."}


def test_human_report_explains_the_failure(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["logscan", str(FIX / "failures" / "draft_extend_capture_import_error.log")]) == 0
    out = capsys.readouterr().out
    assert "NOT READY" in out
    assert "draft_capture_failed at line 66" in out
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


def _lines_with(path: Path, text: str) -> list[int]:
    """1-based numbers of the lines holding `text`, as `grep -n` and editors count them."""
    return [i for i, line in enumerate(path.read_bytes().split(b"\n"), 1) if text.encode() in line]


def test_failure_line_is_the_editors_line_not_a_progress_frame(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIX / "failures" / "draft_extend_capture_import_error.log"
    data = path.read_bytes()
    assert data.count(b"\r") > 100  # tqdm frames the old count included
    assert cli.main(["logscan", "--json", str(path)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["failure"]["line"] == _lines_with(path, "No module named 'deep_gemm'")[-1]
    assert row["runs"][0]["last_line"] == data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _several_runs(tmp_path: Path) -> Path:
    """The documented engine log: a READY run, a run whose capture failed, a run still starting."""
    ready = (FIX / "graphs.log").read_bytes()
    failed = (FIX / "failures" / "decode_capture_oom.log").read_bytes()
    starting = b"".join(ready.splitlines(keepends=True)[:12])  # past its server_args line
    log = tmp_path / "engine.log"
    log.write_bytes(ready.rstrip(b"\n") + b"\n" + failed.rstrip(b"\n") + b"\n" + starting)
    return log


def test_several_runs_last_summarised_others_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _several_runs(tmp_path)
    assert cli.main(["logscan", "--json", str(log)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["run"] == 3 and len(row["runs"]) == 3
    assert row["ready"] is False and row["failure"] is None  # the last run: still starting
    assert row["capture"]["began"] is False  # no capture of another run paired with this one
    first, second, third = row["runs"]
    assert first["ready"] is True and first["failure"] is None
    assert second["ready"] is False and second["failure"] == "capture_oom"
    starts = _lines_with(log, "server_args=")
    assert [first["first_line"], second["first_line"], third["first_line"]] == [1, *starts[1:]]
    assert first["last_line"] == second["first_line"] - 1
    assert third["last_line"] == log.read_bytes().count(b"\n")  # wc -l (the file ends with \n)


def test_run_option_picks_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _several_runs(tmp_path)
    assert cli.main(["logscan", "--json", "--run", "2", str(log)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["run"] == 2 and row["failure"]["class"] == "capture_oom"
    assert row["ready"] is False  # not the READY of run 1
    failed_at = row["failure"]["line"]
    assert row["runs"][1]["first_line"] <= failed_at <= row["runs"][1]["last_line"]
    assert cli.main(["logscan", str(log)]) == 0
    out = capsys.readouterr().out
    assert "this is run 3 of 3" in out and "run 1: lines 1-" in out and "run 2: lines" in out
    assert "READY" in out.split("\n")[0] and "NOT READY" in out.split("\n")[0]
    assert cli.main(["logscan", "--run", "4", str(log)]) == 1
    assert "holds 3 run(s)" in capsys.readouterr().err


def test_explain_names_the_fallback_profile_of_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[3] / "etc" / "sglang-supervisor" / "qwen.yaml"
    cases = {"prefill_capture_oom.log": ("prefill_graph_failed", "no-prefill-graph"),
             "decode_capture_oom.log": ("capture_oom", "low-mem"),
             "draft_extend_capture_import_error.log": ("draft_capture_failed", "no-spec"),
             "unknown_flag.log": ("unknown_flag", None)}
    for name, (cls, profile) in cases.items():
        assert cli.main(["logscan", "--json", "--explain", "--config", str(config),
                         str(FIX / "failures" / name)]) == 0
        row = json.loads(capsys.readouterr().out)
        assert row["explain"]["class"] == cls, name
        assert row["explain"]["next_profile"] == profile, name
        assert row["explain"]["line"] == row["failure"]["line"]
    assert cli.main(["logscan", "--explain", "--config", str(config),
                     str(FIX / "failures" / "decode_capture_oom.log")]) == 0
    out = capsys.readouterr().out
    assert "the supervisor would start profile 'low-mem' next" in out
    assert "lower static memory fraction" in out  # the profile's own description


def test_explain_without_a_config_says_how_to_name_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.yaml"
    assert cli.main(["logscan", "--explain", "--config", str(missing),
                     str(FIX / "failures" / "kv_oom.log")]) == 0
    out = capsys.readouterr().out
    assert "kv_cache_oom at line" in out and "pass --config FILE" in out


def test_json_keys_are_documented() -> None:
    """docs/LOGSCAN.md is the contract: every key logscan prints has a row there."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "LOGSCAN.md").read_text()
    for key in [*KEYS, "explain"]:
        assert f"| `{key}` |" in doc, key


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO without a writer: a plain open() never returns. logscan names it and says how to
    pipe a stream in instead, and still scans the other files."""
    fifo = tmp_path / "engine.fifo"
    os.mkfifo(fifo)
    result: list[int] = []
    scan = threading.Thread(target=lambda: result.append(
        cli.main(["logscan", str(fifo), str(FIX / "eager.log")])), daemon=True)
    scan.start()
    scan.join(60)  # a guard against a hang, not a measure: the answer needs no writer at all
    if scan.is_alive():  # blocked in open(): let it go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        scan.join()
        pytest.fail("logscan waited for a writer on a FIFO")
    assert result == [1]
    captured = capsys.readouterr()
    assert f"cannot read {fifo}: not a regular file" in captured.err
    assert "logscan - <" in captured.err
    assert "eager.log: READY" in captured.out
