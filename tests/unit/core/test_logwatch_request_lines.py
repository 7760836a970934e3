"""SGLang log records *about one request* whose message carries text the user steered (a tool
call or reasoning the model was told to write, an adapter name, a client's disconnect) are no
engine event, like `Error in request:` (issue 12). Their prefixes are SGLang's own f-strings,
found in the 0.5.17 and 0.5.23 wheels: `logger.error(f"Tool call parsing error: {e}")`
(serving_chat.py), `f"Reasoning parsing error: {e}"`, `f"DS32EncodingError: {e}"`
(serving_base.py), `f"[http_server] Client disconnected: {e}"`, and
`f"Reloading evicted adapter: {lora_path}"` (tokenizer_manager.py; lora_path is a request field)."""

from __future__ import annotations

import pytest

from sglang_supervisor.core.events import EngineCrashed, EngineFailed, ServerReady
from sglang_supervisor.core.logwatch import parse_lines

HDR = "[2026-12-01 13:53:16] "
QUOTED = [
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "error: unrecognized arguments: --user",
    "OSError: [Errno 98] Address already in use",
    "Scheduler watchdog timeout (self.watchdog_timeout=300)",
]
PREFIXES = [
    "Tool call parsing error: ",
    "Reasoning parsing error: ",
    "DS32EncodingError: ",
    "[http_server] Client disconnected: ",
    "Reloading evicted adapter: ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("quoted", QUOTED)
def test_a_request_record_quoting_a_failure_is_no_event(prefix: str, quoted: str) -> None:
    decode = ("Decode batch, #running-req: 1, #token: 1, token usage: 0.00, cuda graph: True, "
              "gen throughput (token/s): 1.00, #queue-req: 0")
    events = parse_lines([HDR + prefix + quoted, HDR + decode])
    assert [e for e in events if isinstance(e, (EngineFailed, EngineCrashed, ServerReady))] == []


def test_the_engine_s_own_failure_line_still_counts() -> None:
    # The prefixes are matched at the start of the message only.
    events = parse_lines([HDR + "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert any(isinstance(e, EngineFailed) for e in events)


# What str.splitlines() would split on besides \n and \r. SGLang prints them raw in a request
# dict's key (text form) and, for U+0085, U+2028 and U+2029, in any string of the json form
# (ensure_ascii=False): a reader that split on them would let a prompt start a line of its own.
OTHER_LINE_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
NOW = 1796133196.0


@pytest.mark.parametrize("sep", OTHER_LINE_BREAKS)
def test_only_newline_and_carriage_return_end_a_line(sep: str) -> None:
    from sglang_supervisor.core.logwatch import LineSplitter, parse_bytes
    from sglang_supervisor.simulator import reqlog

    forged = (f"hi{sep}[2026-12-01 10:00:00] RuntimeError: CUDA error: forged"
              f"{sep}The server is fired up and ready to roll!")
    records = [reqlog.receive(reqlog.generate_req("r1", "hi", {forged: 1}), 1, "text", NOW)]
    if sep >= "\x80":
        records.append(reqlog.receive(reqlog.generate_req("r1", forged, {}), 3, "json", NOW))
    for record in records:
        data = reqlog.line(record, NOW).encode()
        assert sep in data.decode()  # printed raw: the premise
        splitter = LineSplitter()
        assert len([*splitter.feed(data), *splitter.flush()]) == 1
        events = parse_bytes(data)
        assert [e for e in events if isinstance(e, (EngineFailed, EngineCrashed, ServerReady))] == []
