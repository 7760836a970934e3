# ruff: noqa: E501  (real log lines are long; wrapping them would change what is tested)
"""User text that SGLang echoes into its log (--log-requests, access lines, failed requests) is
never an engine event: not a failure, not a crash, not a capture, not ready (issue 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor import cli
from sglang_supervisor.core.events import EngineCrashed, EngineFailed, FailureClass, ServerReady
from sglang_supervisor.core.logwatch import parse_bytes, parse_lines, root_failure, summarize
from sglang_supervisor.simulator import reqlog

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang-0.5.17-h200-log-requests"
NOW = 1796133196.0
HDR = "[2026-12-01 13:53:16] "

# Text a user can send: anything printable or not (no lone surrogates: they cannot be encoded),
# mixed with the phrases a log reader looks for and forged lines behind a newline.
user_text = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=300),
    st.sampled_from(reqlog.HOSTILE_PROMPTS),
    st.lists(st.one_of(st.sampled_from(reqlog.HOSTILE_PROMPTS),
                       st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
                       st.sampled_from(["\n", "\r", "\r\n", "\n[2026-12-01 10:00:00 TP0] ", "')", "}"])),
             max_size=8).map("".join),
)


def _lines_0_5_x(text: str, level: int, fmt: str) -> list[str]:
    """Everything a 0.5.x engine logs for one request carrying `text` (prompt and output)."""
    obj = reqlog.generate_req("a" * 32, text, {"max_new_tokens": 8, "stop": [text]})
    out = {"text": text, "output_ids": [1, 2], "meta_info": {"id": "a" * 32, "finish_reason": {"type": "stop", "matched": text}}}
    body = {"model": text, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return [HDR + reqlog.receive_openai(body, level, fmt, NOW), HDR + reqlog.receive(obj, level, fmt, NOW),
            HDR + reqlog.finish(obj, out, level, fmt, NOW)]


def _legacy_in_out(text: str) -> str:
    """0.3.x: `in={obj}, out={out}` with the dataclass's own repr."""
    return f"[2024-10-01 12:00:00] in=GenerateReqInput(text={text!r}, sampling_params={{}}, rid='r'), out={{'text': {text!r}}}"


def _access(target: str) -> str:
    return f'{HDR}INFO:     127.0.0.1:34010 - "POST {target} HTTP/1.1" 200 OK'


def _feed(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _assert_nothing(data: bytes) -> None:
    events = parse_bytes(data)
    assert events == []
    summary = summarize(events)
    assert summary.failure is None and not summary.crashed and not summary.ready
    assert summary.capture["began"] is False


@settings(max_examples=300, deadline=None)
@given(user_text, st.sampled_from(reqlog.LEVELS), st.sampled_from(reqlog.FORMATS))
def test_any_text_in_any_0_5_request_log_form_is_no_event(text: str, level: int, fmt: str) -> None:
    _assert_nothing(_feed(_lines_0_5_x(text, level, fmt)))


@settings(max_examples=200, deadline=None)
@given(user_text, st.sampled_from(reqlog.LEVELS), st.sampled_from(reqlog.FORMATS))
def test_long_text_is_cut_the_way_level_2_cuts_it_and_stays_no_event(text: str, level: int, fmt: str) -> None:
    # Level 2 cuts strings over 2048 characters to `'first half' ... 'last half'`; the hostile
    # part sits at both ends and in the middle.
    long = text + "x" * 2100 + text + "y" * 2100 + text
    _assert_nothing(_feed(_lines_0_5_x(long, level, fmt)))


@settings(max_examples=200, deadline=None)
@given(user_text)
def test_any_text_in_the_0_3_request_log_is_no_event(text: str) -> None:
    _assert_nothing(_feed([_legacy_in_out(text)]))


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=200))
def test_any_request_target_in_an_access_line_is_no_event(target: str) -> None:
    # h11 lets no space or control byte into a request target, so an access line is one line.
    _assert_nothing(_feed([_access("/generate?" + target), _access("/" + target)]))


@settings(max_examples=200, deadline=None)
@given(user_text.filter(lambda t: not any(part.rstrip().endswith((")", "}")) for part in t.replace("\r", "\n").split("\n")[:-1])))
def test_raw_string_echo_of_old_builds_is_no_event_until_it_closes(text: str) -> None:
    # Builds of late 2024 printed strings raw (`text="..."`, real newlines). The lines after an
    # unclosed echo are read as its rest until one ends with its closing bracket; text that ends
    # a line with `)` or `}` can close it early (the residual risk docs/FAULTS.md names).
    line = f'{HDR}Receive: obj=GenerateReqInput(text="{text}", sampling_params={{}}, rid="r")'
    _assert_nothing(_feed([line]))


def test_the_real_log_requests_run_keeps_serving() -> None:
    # Real SGLang 0.5.17 with --log-requests --log-requests-level 2: two prompts quoted an
    # argparse error and a CUDA error. This log made the supervisor exit 78.
    events = parse_bytes((FIX / "engine.log").read_bytes())
    assert not [e for e in events if isinstance(e, (EngineFailed, EngineCrashed))]
    assert sum(isinstance(e, ServerReady) for e in events) == 1
    summary = summarize(events).to_json()
    assert summary["ready"] is True and summary["failure"] is None and summary["crashed"] is False


def test_the_simulator_renders_the_real_records_byte_for_byte() -> None:
    lines = [line.split("] ", 1)[1] for line in (FIX / "engine.log").read_text(encoding="utf-8").split("\n")
             if "] Receive: obj=" in line or "] Finish: obj=" in line]
    obj = reqlog.generate_req("7da2c8f03329461588b3e058e13ac74e", "The capital city of France is",
                              {"temperature": 0, "max_new_tokens": 8})
    assert reqlog.receive(obj, 2, "text", NOW) == lines[0]
    out_text = lines[1].split(", out=", 1)[1]
    out = {"text": " is is", "output_ids": [359, 359, 878, 878, 878, 878, 878, 878]}
    assert out_text.startswith(reqlog.to_text(out, 2048)[:-1])
    assert lines[1].startswith(reqlog.finish(obj, out, 2, "text", NOW)[:-1])


def test_logscan_reports_nothing_for_an_echoed_prompt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "engine.log"
    log.write_text(
        "[2026-12-01 10:00:31] Capture cuda graph begin. This can take up to several minutes. avail mem=19.50 GB\n"
        "[2026-12-01 10:00:40] Capture cuda graph end. Time elapsed: 9.10 s. mem usage=1.20 GB. avail mem=18.30 GB.\n"
        "[2026-12-01 10:00:44] The server is fired up and ready to roll!\n"
        "[2026-12-01 10:01:00] Receive: obj=GenerateReqInput(rid='1', text='pip says: error: unrecognized arguments: --user; RuntimeError: CUDA error: an illegal memory access was encountered; OSError: [Errno 98] Address already in use', sampling_params={'max_new_tokens': 64})\n",
        encoding="utf-8")
    assert cli.main(["logscan", "--json", str(log)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["failure"] is None and row["crashed"] is False and row["ready"] is True


def test_an_echo_cut_by_another_process_write_hides_its_rest() -> None:
    # A long echo written in several pieces with a scheduler line landing in between: the
    # remainder starts a line of its own, without header, full of user text.
    events = parse_lines([
        HDR + "Receive: obj=GenerateReqInput(rid='1', text='CUDA error: an illegal memory",
        "[2026-12-01 13:53:16 TP0] Decode batch, #running-req: 1, #token: 10, token usage: 0.00, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0",
        " access was encountered. The server is fired up and ready to roll!', sampling_params={})",
        "[2026-12-01 13:53:17] Received sigquit from a child process. It usually means the child failed.",
    ])
    assert [type(e).__name__ for e in events] == ["EngineCrashed"]


def test_a_failed_request_and_its_traceback_blame_nothing() -> None:
    # logger.exception(f"Error in request: {e}") with the user's text in the exception.
    events = parse_lines([
        HDR + "Error in request: CUDA error: an illegal memory access was encountered",
        "Traceback (most recent call last):",
        '  File "serving_base.py", line 120, in handle_request',
        "ValueError: CUDA error: an illegal memory access was encountered",
        HDR + "[http_server] Error: error: unrecognized arguments: --user",
        HDR + "INFO:     127.0.0.1:1 - \"POST /generate HTTP/1.1\" 400 Bad Request",
        HDR + "ERROR:    Exception in ASGI application",  # uvicorn: a handler raised
        "Traceback (most recent call last):",
        '  File "starlette/routing.py", line 1, in app',
        "RuntimeError: CUDA error: an illegal memory access was encountered; Address already in use",
    ])
    assert not [e for e in events if isinstance(e, (EngineFailed, EngineCrashed))]


def test_a_real_failure_after_echoes_is_still_found() -> None:
    lines = [*_lines_0_5_x("error: unrecognized arguments: --x", 2, "text"),
             "[2026-12-01 13:53:20 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "scheduler.py", line 1, in event_loop',
             "RuntimeError: CUDA error: an illegal memory access was encountered",
             "[2026-12-01 13:53:20] Received sigquit from a child process. It usually means the child failed."]
    failure = root_failure(parse_lines(lines))
    assert failure is not None and failure.failure is FailureClass.CUDA_ERROR


def test_key_lines_count_only_at_the_start_of_a_message() -> None:
    # Not an echo, but text quoting the key lines: a log reader must not act on it.
    events = parse_lines([
        HDR + "User said: The server is fired up and ready to roll!",
        HDR + "note: Capture cuda graph begin. avail mem=1 GB",
        HDR + "note: Subprocess scheduler_0 (pid=1) crashed with exit code -9.",
        HDR + "note: Received sigquit from a child process.",
        HDR + "note: Decode batch, #running-req: 1, gen throughput (token/s): 9.00",
    ])
    assert events == []
