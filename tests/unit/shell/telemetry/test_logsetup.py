"""Logging formats, engine-line forwarding, redaction and a stdout that breaks."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.shell.telemetry import logsetup
from sglang_supervisor.shell.telemetry.logsetup import (
    configure_logging,
    encode_journal_fields,
    journal_field_name,
    log_engine_line,
    log_engine_lines,
    logfmt_value,
    render_logfmt,
    set_redactions,
)

LOGFMT_PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S*)')


ESCAPE = re.compile(r'\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|.)')
SIMPLE = {"n": "\n", "r": "\r", "t": "\t"}


def unquote(raw: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if len(code) > 1:
            return chr(int(code[1:], 16))
        return SIMPLE.get(code, code)

    return ESCAPE.sub(one, raw[1:-1])


def parse_logfmt(text: str) -> dict[str, str]:
    return {key: unquote(raw) if raw.startswith('"') else raw for key, raw in LOGFMT_PAIR.findall(text)}


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    logsetup.shutdown_logging()
    set_redactions([])
    structlog.reset_defaults()


def test_journald_lines_carry_priority_event_and_logfmt_fields() -> None:
    buf = io.StringIO()
    assert configure_logging("journald", buf, native_journal=False) == "journald"
    log = structlog.get_logger()
    log.warning("capture_failed", profile="primary", failure_class="capture_oom", seconds=1.5)
    log.info("engine_ready", profile="primary", note='said "go"\nnow')
    log.error("all_profiles_failed", attempts=3)
    log.debug("not_shown")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0] == "<4>capture_failed profile=primary failure_class=capture_oom seconds=1.5"
    assert lines[1].startswith("<6>engine_ready ")
    assert parse_logfmt(lines[1]) == {"profile": "primary", "note": 'said "go"\nnow'}
    assert lines[2] == "<3>all_profiles_failed attempts=3"


def test_journald_exception_stays_on_one_line() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger().exception("loop_crashed")
    [line] = buf.getvalue().splitlines()
    assert line.startswith("<3>loop_crashed exception=")
    assert "RuntimeError: boom" in parse_logfmt(line)["exception"]


def test_json_format_is_one_object_per_line() -> None:
    buf = io.StringIO()
    assert configure_logging("json", buf) == "json"
    structlog.get_logger().info("probe_done", tok_s=1234.5, profile="primary")
    structlog.get_logger().warning("regression", delta=0.2)
    records = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert records[0]["event"] == "probe_done"
    assert records[0]["tok_s"] == 1234.5
    assert records[0]["level"] == "info"
    assert "timestamp" in records[0]
    assert records[1]["level"] == "warning"


def test_json_exceptions_never_include_local_variables() -> None:
    buf = io.StringIO()
    configure_logging("json", buf)
    api_key = "sk-local-secret-value"
    try:
        raise ValueError(len(api_key))
    except ValueError:
        structlog.get_logger().exception("failed")
    assert "sk-local-secret-value" not in buf.getvalue()
    assert json.loads(buf.getvalue())["exception"][0]["exc_type"] == "ValueError"


def test_console_format_is_readable_and_uncoloured_off_a_tty() -> None:
    buf = io.StringIO()
    assert configure_logging("console", buf) == "console"
    structlog.get_logger().info("engine_started", pid=42)
    log_engine_line("Load weight end.", 6, rank="TP1")
    text = buf.getvalue()
    assert "engine_started" in text
    assert "pid=42" in text
    assert "[engine TP1] Load weight end." in text
    assert "\x1b[" not in text


def test_auto_picks_json_off_a_tty_and_journald_under_systemd() -> None:
    assert configure_logging("auto", io.StringIO(), environ={}) == "json"
    # StringIO has no descriptor to compare with JOURNAL_STREAM: the variable is trusted.
    assert configure_logging("auto", io.StringIO(), environ={"JOURNAL_STREAM": "8:1"},
                             native_journal=False) == "journald"


def test_auto_ignores_a_journal_stream_that_is_not_our_stdout(tmp_path: Path) -> None:
    with open(tmp_path / "out.log", "w") as f:
        st = os.fstat(f.fileno())
        # A regular file redirected by hand, whatever JOURNAL_STREAM says, is not the journal.
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert configure_logging("auto", f, environ=env) == "json"


def test_auto_recognises_the_journal_stream_socket() -> None:
    a, b = socket.socketpair()
    try:
        st = os.fstat(a.fileno())
        with os.fdopen(os.dup(a.fileno()), "w") as stream:
            env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
            assert configure_logging("auto", stream, environ=env, native_journal=False) == "journald"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("priority", "prefix"), [(3, "<3>"), (4, "<4>"), (6, "<6>")]
)
def test_engine_lines_are_marked_and_keep_their_priority(priority: int, prefix: str) -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    log_engine_line("[2026-01-01 TP0] Scheduler hit an exception: x=1", priority, rank="TP0")
    [line] = buf.getvalue().splitlines()
    assert line.startswith(prefix + "engine.output ")
    assert parse_logfmt(line) == {
        "source": "engine", "rank": "TP0", "text": "[2026-01-01 TP0] Scheduler hit an exception: x=1",
    }


def test_engine_lines_in_json() -> None:
    buf = io.StringIO()
    configure_logging("json", buf)
    log_engine_line("RuntimeError: CUDA error", 3)
    record = json.loads(buf.getvalue())
    assert record["source"] == "engine"
    assert record["level"] == "error"
    assert record["text"] == "RuntimeError: CUDA error"


def test_engine_debug_lines_follow_the_level_filter() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False, level="info")
    log_engine_line("noise", 7)
    assert buf.getvalue() == ""


def test_megabyte_engine_lines_are_truncated_for_the_journal() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    log_engine_line("x" * 1_000_000, 6)
    [line] = buf.getvalue().splitlines()
    assert len(line) < logsetup.MAX_ENGINE_LINE_CHARS + 200
    assert "truncated, 1000000 chars" in line


def test_control_characters_never_split_a_line() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    log_engine_line("Capturing batches (bs=8):  50%|\r\x1b[K  75%|\x00", 6)
    assert len(buf.getvalue().splitlines()) == 1


def test_secrets_are_redacted_everywhere() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    set_redactions(["sk-supersecret-123", ""])
    structlog.get_logger().info("engine_args", argv="--api-key sk-supersecret-123")
    log_engine_line("server_args=ServerArgs(api_key='sk-supersecret-123')", 6)
    text = buf.getvalue()
    assert "sk-supersecret-123" not in text
    assert text.count("***") == 2


def test_a_closed_stdout_never_raises_and_counts_dropped_lines() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    buf.close()
    structlog.get_logger().error("still_alive")
    log_engine_line("engine line", 6)
    assert logsetup.dropped_lines() == 2


def test_a_broken_pipe_never_raises() -> None:
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as stream:
        configure_logging("journald", stream, native_journal=False)
        structlog.get_logger().warning("journald_gone")
        log_engine_line("engine line", 3)
        assert logsetup.dropped_lines() == 2


def test_background_mode_never_blocks_on_a_stuck_reader() -> None:
    r, w = os.pipe()
    try:
        stream = os.fdopen(w, "w")
        configure_logging("journald", stream, native_journal=False, background=True)
        # Far more than a pipe buffer holds and nobody reads: the caller must still return.
        for i in range(30_000):
            log_engine_line(f"line {i} " + "x" * 100, 6)
        assert logsetup.dropped_lines() > 0
        with os.fdopen(r, "rb") as reader:
            os.set_blocking(reader.fileno(), False)
            head = reader.read(4096)
        assert head.startswith(b"<6>engine.output source=engine text=\"line 0 ")
    finally:
        logsetup.shutdown_logging(timeout=0.1)
        stream.close()


def test_background_mode_flushes_on_shutdown() -> None:
    buf = io.StringIO()
    configure_logging("json", buf, background=True)
    for i in range(100):
        structlog.get_logger().info("tick", i=i)
    logsetup.shutdown_logging()
    assert [json.loads(line)["i"] for line in buf.getvalue().splitlines()] == list(range(100))


def _read_journal_datagram(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(1 << 20)
    fields: dict[str, str] = {}
    while data:
        nl = data.index(b"\n")
        head = data[:nl]
        if b"=" in head:
            k, v = head.split(b"=", 1)
            fields[k.decode()] = v.decode()
            data = data[nl + 1:]
        else:
            (size,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            fields[head.decode()] = data[nl + 9:nl + 9 + size].decode()
            data = data[nl + 9 + size + 1:]
    return fields


@pytest.fixture
def journal_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "journal.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_native_journal_sink_sends_fields(journal_socket: tuple[socket.socket, str]) -> None:
    sock, path = journal_socket
    buf = io.StringIO()
    configure_logging("journald", buf, environ={"JOURNAL_STREAM": "1:1"}, journal_socket=path,
                      identifier="sglang-supervisor")
    structlog.get_logger().warning("capture_failed", profile="primary", phase="capturing_graphs",
                                   failure_class="capture_oom", detail="line1\nline2")
    fields = _read_journal_datagram(sock)
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "sglang-supervisor"
    assert fields["PROFILE"] == "primary"
    assert fields["PHASE"] == "capturing_graphs"
    assert fields["FAILURE_CLASS"] == "capture_oom"
    assert fields["DETAIL"] == "line1\nline2"
    assert fields["MESSAGE"].startswith("capture_failed profile=primary")
    log_engine_line("Load weight end.", 6, rank="TP0")
    fields = _read_journal_datagram(sock)
    assert fields == {"MESSAGE": "Load weight end.", "PRIORITY": "6",
                      "SYSLOG_IDENTIFIER": "sglang-supervisor", "SOURCE": "engine",
                      "EVENT": "engine.output", "ENGINE_RANK": "TP0"}
    assert buf.getvalue() == ""  # nothing doubled on stdout


def test_native_journal_falls_back_to_stdout_when_journald_is_gone(
    journal_socket: tuple[socket.socket, str],
) -> None:
    sock, path = journal_socket
    buf = io.StringIO()
    configure_logging("journald", buf, environ={"JOURNAL_STREAM": "1:1"}, journal_socket=path)
    sock.close()
    os.unlink(path)
    structlog.get_logger().error("engine_crashed", profile="primary")
    assert buf.getvalue() == "<3>engine_crashed profile=primary\n"


def test_native_journal_not_used_without_journal_stream(journal_socket: tuple[socket.socket, str]) -> None:
    _, path = journal_socket
    buf = io.StringIO()
    configure_logging("journald", buf, environ={}, journal_socket=path)
    structlog.get_logger().info("hello")
    assert buf.getvalue() == "<6>hello\n"


def test_pure_helpers() -> None:
    assert logfmt_value("plain") == "plain"
    assert logfmt_value("") == '""'
    assert logfmt_value(None) == ""
    assert logfmt_value(True) == "true"
    assert logfmt_value('a b"c\\') == '"a b\\"c\\\\"'
    assert logfmt_value("tab\there") == '"tab\\there"'
    assert render_logfmt("an event", {"bad key": 1}) == "an_event bad_key=1"
    assert journal_field_name("failure_class") == "FAILURE_CLASS"
    assert journal_field_name("_private") == "PRIVATE"
    assert journal_field_name("1st") is None
    assert encode_journal_fields({"A": "x", "B": "y\nz"}) == (
        b"A=x\nB\n" + struct.pack("<Q", 3) + b"y\nz\n"
    )


def test_unknown_level_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="log level 'loud'"):
        configure_logging("json", io.StringIO(), level="loud")


@settings(max_examples=200, deadline=None)
@given(st.text(), st.dictionaries(st.text(min_size=1, max_size=10), st.one_of(st.text(), st.integers(),
                                                                              st.none(), st.booleans())))
def test_any_event_renders_as_exactly_one_line(event: str, fields: dict[str, object]) -> None:
    line = render_logfmt(event, fields)
    assert "\n" not in line and "\r" not in line
    for value in fields.values():
        if isinstance(value, str):
            rendered = logfmt_value(value)
            assert "\n" not in rendered
            assert parse_logfmt(f"k={rendered}")["k"] == value


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_any_engine_text_is_one_journald_line(text: str) -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    log_engine_line(text, 3)
    assert buf.getvalue().count("\n") == 1
    assert buf.getvalue().startswith("<3>engine.output source=engine text=")


def test_a_burst_reaches_the_journal_as_fields_not_stdout_fallbacks(
    journal_socket: tuple[socket.socket, str],
) -> None:
    # The socket's queue holds only net.unix.max_dgram_qlen datagrams (10 where systemd's sysctl
    # drop-in is missing): a burst larger than that must wait for journald, not lose its fields.
    sock, path = journal_socket
    buf = io.StringIO()
    configure_logging("journald", buf, environ={"JOURNAL_STREAM": "1:1"}, journal_socket=path,
                      background=True)
    burst = 200
    for i in range(burst):
        log_engine_line(f"Decode batch, #running-req: {i}", 6, rank="TP0")
    received = [_read_journal_datagram(sock)["MESSAGE"] for _ in range(burst)]
    logsetup.shutdown_logging()
    assert received == [f"Decode batch, #running-req: {i}" for i in range(burst)]
    assert buf.getvalue() == ""


def test_journal_fields_render_values_like_the_message(journal_socket: tuple[socket.socket, str]) -> None:
    sock, path = journal_socket
    configure_logging("journald", io.StringIO(), environ={"JOURNAL_STREAM": "1:1"}, journal_socket=path)
    structlog.get_logger().info("engine.stopped", killed=False, drained=True, left=[1, 2], code=None)
    fields = _read_journal_datagram(sock)
    got = (fields["KILLED"], fields["DRAINED"], fields["LEFT"], fields["CODE"])
    assert got == ("false", "true", "[1, 2]", "")
    assert "killed=false drained=true" in fields["MESSAGE"]


def _reference_line(text: str, priority: int, rank: str | None) -> str:
    """One engine line as the journald format has always rendered it."""
    rank_part = "" if rank is None else f" rank={logfmt_value(rank)}"
    return f"<{priority}>engine.output source=engine{rank_part} text={logfmt_value(text)}"


SECRETS = ["sk-secret-1", "Decode", 'y "hi', "a\nbc", "C:\\p", "x\x07yz"]
ENGINE_TEXT = st.one_of(
    # Mostly plain ASCII built from pieces that hold the secrets, quotes, backslashes and `=`.
    st.lists(st.sampled_from([*SECRETS[:5], " ", "=", '"', "\\", "batch", "\x1b[0m", "é"]),
             max_size=6).map("".join),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e)),
    st.text(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ENGINE_TEXT, st.sampled_from([3, 4, 6, 7]),
                          st.sampled_from([None, "TP0", "DP0 TP1"])), max_size=20),
       st.lists(st.sampled_from(SECRETS), max_size=2))
def test_a_batch_renders_line_by_line_as_each_line_alone(
    lines: list[tuple[str, int, str | None]], secrets: list[str],
) -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    set_redactions(secrets)
    log_engine_lines(lines)
    ordered = sorted(set(secrets), key=len, reverse=True)

    def redact(text: str) -> str:
        for secret in ordered:
            text = text.replace(secret, "***")
        return text

    expected = [_reference_line(redact(text), prio, None if rank is None else redact(rank))
                for text, prio, rank in lines if prio <= 6]  # debug is filtered at info
    assert buf.getvalue() == "".join(f"{line}\n" for line in expected)


@pytest.mark.parametrize("fmt", ["journald", "json", "console"])
def test_a_batch_leaves_out_what_is_less_severe_than_asked(fmt: logsetup.LogFormat) -> None:
    buf = io.StringIO()
    configure_logging(fmt, buf, native_journal=False)
    log_engine_lines([("info line", 6, None), ("warning line", 4, "TP0"), ("error line", 3, None)],
                     max_priority=4)
    text = buf.getvalue()
    assert "info line" not in text
    assert "warning line" in text and "error line" in text
    assert len(text.splitlines()) == 2


def test_a_batch_is_redacted_text_and_rank() -> None:
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    set_redactions(["sk-batch-secret"])
    log_engine_lines([("api_key=sk-batch-secret", 6, None), ("x", 3, "sk-batch-secret"),
                      ("plain line", 6, "TP0")])
    assert buf.getvalue().splitlines() == [
        '<6>engine.output source=engine text="api_key=***"',
        '<3>engine.output source=engine rank=*** text=x',
        '<6>engine.output source=engine rank=TP0 text="plain line"',
    ]


def test_a_batch_in_json_and_console_formats() -> None:
    buf = io.StringIO()
    configure_logging("json", buf)
    log_engine_lines([("Load weight end.", 6, "TP1"), ("RuntimeError: x", 3, None), ("dbg", 7, None)])
    records = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [(r["text"], r["level"], r.get("rank")) for r in records] == [
        ("Load weight end.", "info", "TP1"), ("RuntimeError: x", "error", None)]
    buf = io.StringIO()
    configure_logging("console", buf)
    log_engine_lines([("Load weight end.", 6, "TP1"), ("bell\x07", 6, None)])
    assert buf.getvalue() == "[engine TP1] Load weight end.\n[engine] bell\\x07\n"


def test_a_batch_reaches_the_native_journal_as_one_datagram_per_line_in_order(
    journal_socket: tuple[socket.socket, str],
) -> None:
    sock, path = journal_socket
    buf = io.StringIO()
    configure_logging("journald", buf, environ={"JOURNAL_STREAM": "1:1"}, journal_socket=path,
                      identifier="sglang-supervisor", background=True)
    log_engine_lines([("Decode batch, #running-req: 1", 6, "TP0"), ('Traceback "x"', 3, None),
                      ("two\nlines", 6, None)])
    structlog.get_logger().info("after_the_batch")
    got = [_read_journal_datagram(sock) for _ in range(4)]
    logsetup.shutdown_logging()
    assert got[0] == {"MESSAGE": "Decode batch, #running-req: 1", "PRIORITY": "6",
                      "SYSLOG_IDENTIFIER": "sglang-supervisor", "SOURCE": "engine",
                      "EVENT": "engine.output", "ENGINE_RANK": "TP0"}
    assert (got[1]["MESSAGE"], got[1]["PRIORITY"], "ENGINE_RANK" in got[1]) == ('Traceback "x"', "3", False)
    assert got[2]["MESSAGE"] == "two\nlines"
    assert got[3]["EVENT"] == "after_the_batch"
    assert buf.getvalue() == ""


def test_background_writer_keeps_a_burst_whole_and_in_order(tmp_path: Path) -> None:
    # A burst bigger than one write's worth, from several batches and single events interleaved.
    out_path = tmp_path / "stdout"
    with open(out_path, "w") as stream:
        configure_logging("journald", stream, native_journal=False, background=True)
        for b in range(5):
            log_engine_lines([(f"line {b}-{i}", 6, None) for i in range(700)])
            structlog.get_logger().info("between", batch=b)
        logsetup.shutdown_logging(timeout=10)
    expected: list[str] = []
    for b in range(5):
        expected += [f'<6>engine.output source=engine text="line {b}-{i}"' for i in range(700)]
        expected.append(f"<6>between batch={b}")
    assert out_path.read_text().splitlines() == expected
    assert logsetup.dropped_lines() == 0


def test_line_heads_follow_later_settings(journal_socket: tuple[socket.socket, str]) -> None:
    # Heads are cached per (priority, rank): new redactions and a new identifier must still apply.
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    log_engine_line("a", 6, rank="DP0-hidden")
    set_redactions(["DP0-hidden"])
    log_engine_line("b", 6, rank="DP0-hidden")
    assert buf.getvalue().splitlines() == ["<6>engine.output source=engine rank=DP0-hidden text=a",
                                           "<6>engine.output source=engine rank=*** text=b"]
    sock, path = journal_socket
    for name in ("first", "second"):
        configure_logging("journald", io.StringIO(), environ={"JOURNAL_STREAM": "1:1"},
                          journal_socket=path, identifier=name)
        log_engine_line("c", 6, rank="TP0")
        assert _read_journal_datagram(sock)["SYSLOG_IDENTIFIER"] == name


def test_engine_lines_nowait_drop_without_a_background_writer_and_pass_with_one() -> None:
    """The engine pipe's reader forwards with log_engine_lines_nowait: it must never write (and
    maybe block) on the reader's thread, so without a background writer the lines are counted
    as dropped; with one they reach the output as log_engine_lines' would."""
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False)
    assert not logsetup.background_logging()
    logsetup.log_engine_lines_nowait([("held back", 6, None), ("and this", 6, None)])
    assert buf.getvalue() == "" and logsetup.dropped_lines() == 2
    buf = io.StringIO()
    configure_logging("journald", buf, native_journal=False, background=True)
    assert logsetup.background_logging()
    logsetup.log_engine_lines_nowait([("it goes", 6, None)])
    logsetup.shutdown_logging()
    assert buf.getvalue() == "<6>engine.output source=engine text=\"it goes\"\n"
    assert logsetup.dropped_lines() == 0
    assert not logsetup.background_logging()  # after shutdown_logging: written directly again


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(st.text(), st.sampled_from([0, 3, 4, 5, 6, 7, 9]),
                                st.none() | st.text(max_size=8)), max_size=8))
def test_engine_json_lines_are_what_json_dumps_writes(lines: list[tuple[str, int, str | None]]) -> None:
    """The JSON engine lines are built from parts (cheaper), what follows the text once a run of one
    priority and rank; each must stay json.dumps of its record, those below the level left out."""
    configure_logging("json", io.StringIO())
    sink = logsetup._state.sink
    assert sink is not None
    stamp = "2026-12-03T07:00:00.123456Z"
    want = []
    for text, priority, rank in lines:
        level = logsetup._PRIORITY_TO_LEVEL.get(priority, logging.INFO)
        if priority > 7 or level < logging.INFO:
            continue
        record: dict[str, object] = {"event": "engine.output", "source": "engine", "text": text}
        if rank is not None:
            record["rank"] = rank
        record["level"] = logging.getLevelName(level).lower()
        record["timestamp"] = stamp
        want.append(json.dumps(record, ensure_ascii=False))
    assert logsetup._json_items(lines, sink, 7, stamp) == want
