"""engine/resolved.py: the graph sizes SGLang resolved, from its server_args dump (issue 25).

Read from real dumps (0.5.17 on an H200: a profile without the flag, one with it, an eager one)
and from the spellings of the other releases (the simulator prints them the same way).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.core import logwatch
from sglang_supervisor.core.events import ServerArgsSeen
from sglang_supervisor.engine.resolved import resolved_graph_max

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def _dump(path: Path) -> dict[str, str]:
    text = path.read_bytes().decode(errors="replace").replace("\r", "\n")
    [seen] = [e for e in logwatch.parse_lines(text.split("\n")) if isinstance(e, ServerArgsSeen)]
    return seen.args


@pytest.mark.parametrize(("fixture", "expected"), [
    # --cuda-graph-max-bs-decode unset: SGLang's own default on this GPU and model.
    ("sglang-0.5.17-h200-seed/tuned-without-sbo.engine.log", {"decode": 256, "prefill": 8192}),
    ("sglang-0.5.17-h200/graphs.log", {"decode": 16, "prefill": 8192}),  # the flag's 16
    ("sglang-0.5.17-h200/eager.log", {}),  # both graphs disabled: nothing to halve
    ("sglang-0.5.17-h200/failures/decode_capture_oom.log", {"decode": 16}),  # prefill disabled
])
def test_real_0517_dumps(fixture: str, expected: dict[str, int]) -> None:
    assert resolved_graph_max(_dump(FIX / fixture)) == expected


@pytest.mark.parametrize(("args", "expected"), [
    ({"cuda_graph_config": "{'decode': {'backend': 'full', 'max_bs': 160, 'bs': [1, 2]}, "
                           "'prefill': {'backend': 'disabled', 'max_bs': 8192}}"}, {"decode": 160}),
    ({"cuda_graph_max_bs": "160", "disable_cuda_graph": "False",
      "piecewise_cuda_graph_max_tokens": "4096"}, {"decode": 160, "prefill": 4096}),
    ({"cuda_graph_max_bs": "160", "disable_cuda_graph": "True"}, {}),
    ({"cuda_graph_max_bs": "None"}, {}),  # not resolved: unknown, never guessed
    ({}, {}),
])
def test_other_spellings(args: dict[str, str], expected: dict[str, int]) -> None:
    assert resolved_graph_max(args) == expected
