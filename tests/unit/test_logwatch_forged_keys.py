"""A known gap found by attacking issue 12's echo handling (see docs/FAULTS.md, "Residual risk").

SGLang 0.5.17 and 0.5.23 print a request's *dict keys* without repr():
`_dataclass_to_string_truncated` renders a dict as `"'{k}': " + repr(v)` (request_logger.py), and
`sampling_params` (logged from --log-requests-level 1 up), `chat_template_kwargs`, `logit_bias` and
`metadata` of OpenAI requests (level 2 up) are dicts whose keys the user chooses. A key holding a
newline therefore starts a physical line that the user wrote, header included; nothing in the
text tells it from the engine's own lines. The simulator's `reqlog.to_text` renders keys the same
way, so this is what a real engine prints.

The sound fix is structural (SGLang writes request records to stdout through their own handler and
its own log lines to stderr: read the two streams apart and never take an event from stdout); it
touches process.py and enginelog.py and is not done. Until then the lifecycle rules hold: such a
line never stops a serving engine, it can at most name the class of a failure the engine really had.
"""

from __future__ import annotations

import pytest

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


@pytest.mark.xfail(strict=True, reason="known gap: SGLang prints dict keys raw; fix = read stdout apart")
@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_forged_line_behind_a_raw_dict_key_is_no_event(level: int) -> None:
    obj = reqlog.generate_req("r1", "hi", {FORGED: 1})
    data = reqlog.line(reqlog.receive(obj, level, "text", NOW), NOW).encode()
    events = parse_bytes(data)
    assert [e for e in events if isinstance(e, (EngineFailed, DecodeStats, ServerReady))] == []
