"""A limit found by attacking issue 12's echo handling (see docs/FAULTS.md, "Residual risk").

SGLang 0.5.8 to 0.5.23 print a request's *dict keys* without repr():
`_dataclass_to_string_truncated` renders a dict as `"'{k}': " + repr(v)` (request_logger.py), and
`sampling_params` (logged from --log-requests-level 1 up), `chat_template_kwargs`, `logit_bias` and
`metadata` of OpenAI requests (level 2 up) are dicts whose keys the user chooses. A key holding a
newline therefore starts a physical line that the user wrote, header included; nothing in the
text tells it from the engine's own lines. The simulator's `reqlog.to_text` renders keys the same
way, so this is what a real engine prints.

The running supervisor is not exposed: SGLang writes these records to stdout through a handler of
their own and its own log to stderr, and the supervisor parses stderr only
(tests/integration/test_enginelog_two_streams.py, and the live daemon in
tests/integration/test_echo_hostile.py::test_a_forged_line_behind_a_raw_dict_key_stops_nothing).
What remains is a saved log, both streams merged with nothing to tell them apart: `logscan` (and
`parse_bytes`) read the forged lines as the engine's (the strict xfail below) and say so in a note.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor import cli
from sglang_supervisor.core.events import DecodeStats, EngineFailed, ServerReady
from sglang_supervisor.core.logwatch import parse_bytes
from sglang_supervisor.simulator import reqlog

NOW = 1796133196.0
FORGED = (
    "x': 1})\n"
    "[2026-12-01 10:00:00.123] Scheduler hit an exception: Traceback (most recent call last):\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "[2026-12-01 10:00:01.000] Decode batch, #running-req: 5, #token: 10, token usage: 0.00, "
    "cuda graph: False, gen throughput (token/s): 0.01, #queue-req: 0\n"
    "[2026-12-01 10:00:02.000] The server is fired up and ready to roll!\n"
    "b"
)


def test_a_raw_dict_key_really_is_printed_across_lines() -> None:
    # What the engine writes (the premise of the gap, checked so that it cannot rot silently).
    record = reqlog.receive(reqlog.generate_req("r1", "hi", {FORGED: 1}), 1, "text", NOW)
    assert "\n[2026-12-01 10:00:02.000] The server is fired up" in record


@pytest.mark.xfail(strict=True, reason="known limit: a merged log (logscan) cannot tell stdout's "
                   "request records from stderr; the live supervisor reads the two apart")
@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_forged_line_behind_a_raw_dict_key_is_no_event(level: int) -> None:
    obj = reqlog.generate_req("r1", "hi", {FORGED: 1})
    data = reqlog.line(reqlog.receive(obj, level, "text", NOW), NOW).encode()
    events = parse_bytes(data)
    assert [e for e in events if isinstance(e, (EngineFailed, DecodeStats, ServerReady))] == []


def test_logscan_says_that_a_merged_log_with_text_form_records_may_hold_a_users_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = reqlog.generate_req("r1", "hi", {FORGED: 1})
    log = tmp_path / "engine.log"
    log.write_text(reqlog.line(reqlog.receive(obj, 2, "text", NOW), NOW))
    assert cli.main(["logscan", str(log)]) == 0
    assert "--log-requests record(s) in the text form" in capsys.readouterr().out
    assert cli.main(["logscan", "--json", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["text_request_records"] == 1
    log.write_text(reqlog.line(reqlog.receive(obj, 2, "json", NOW), NOW))  # json escapes keys
    assert cli.main(["logscan", "--json", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["text_request_records"] == 0
