"""Take off what a log viewer or a wrapper put around SGLang's own lines. Pure.

Users paste engine logs from wherever they read them: a Kubernetes dashboard (box-drawing
borders, padding to the box width), `kubectl logs --timestamps` (an RFC 3339 stamp in front),
`docker compose logs` (`service-1  | `), journald (`Jun 01 12:00:00 host python3[42]: `), or a
supervisor/pipeline that re-logs each line with its own `date - name - LEVEL - `. `unframe`
returns the line as SGLang printed it, so the parser reads one format whatever the framing.
Lines that carry no frame come back unchanged (the parser's hot path never calls this: a line
that starts with SGLang's `[` header has no frame).
"""

from __future__ import annotations

import re

# A border row of a box (`┌────┐`, `├──┤`, `└──┘`, `+----+`): nothing of SGLang's in it.
_BOX_ROW = re.compile(r"^\s*[┌├└╭╰+][─━═\-┬┴┼+]*[┐┤┘╮╯+]?\s*$")
# `│ text   │` (the right border and the padding before it optional: wrapped or cut viewers).
_BORDERED = re.compile(r"^\s*[│┃║] ?(?P<body>.*?)\s*(?:[│┃║]\s*)?$")
_PREFIXES = (
    # `2025-06-01 12:00:00,123 - sglang - INFO - ` (Python logging's common wrapper format).
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+-\s+[\w.\-\[\]]+\s+-\s+[A-Z]+\s+-\s"),
    # `2025-06-01T12:00:00.123456789Z ` (kubectl logs --timestamps, docker logs -t).
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) "),
    # `Jun 01 12:00:00 host python3[4242]: ` (journalctl's short format).
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+\[\d+\]: "),
    # `sglang-1  | ` (docker compose logs).
    re.compile(r"^[\w.\-]+\s+\| "),
)
# Cheap gate: every frame above starts with one of these characters.
_FRAME_START = re.compile(r"^\s*(?:[│┃║┌├└╭╰+]|\d{4}-|[A-Z][a-z]{2} |[\w.\-]+\s+\| )")


def unframe(line: str) -> str:
    """The SGLang line inside `line`'s frames (borders, wrapper prefixes), or `line` itself."""
    for _ in range(3):  # a viewer around a wrapper around a line, at most
        if _FRAME_START.match(line) is None:
            return line
        if _BOX_ROW.match(line):
            return ""
        m = _BORDERED.match(line)
        if m is not None:
            line = m.group("body")
            continue
        for prefix in _PREFIXES:
            p = prefix.match(line)
            if p is not None:
                line = line[p.end() :]
                break
        else:
            return line
    return line
