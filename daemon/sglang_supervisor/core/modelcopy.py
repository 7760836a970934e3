"""A configuration copied for another model, with the keys that must differ per model rewritten in
the text itself: the operator's comments and layout stay (a YAML round trip would drop them).

Only a top-level `name:` and keys one level under a top-level section (`engine.port`,
`metrics.address`, `engine.log_file`) are rewritten; a key the text does not set is added as the
section's first child, a missing section at the end.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_TOP = re.compile(r"^([A-Za-z_][\w-]*):(\s*(?:#.*)?)$")
_TOP_SCALAR = re.compile(r"^([A-Za-z_][\w-]*):\s*(\S.*)?$")
_CHILD = re.compile(r"^(\s+)([A-Za-z_][\w-]*):(\s*)([^#\n]*?)(\s+#.*)?$")


def retarget(text: str, name: str, values: Mapping[tuple[str, str], str]) -> str:
    """`text` with `name: NAME` and each (section, key) of `values` set to its value (written as
    given: the caller quotes what YAML would misread)."""
    lines = text.splitlines()
    todo = dict(values)
    out: list[str] = []
    section: str | None = None
    indent: str | None = None
    named = False
    for line in lines:
        top = _TOP.match(line)
        if top:
            section, indent = top.group(1), None
            out.append(line)
            continue
        scalar = _TOP_SCALAR.match(line)
        if scalar:
            section = None
            if scalar.group(1) == "name":
                out.append(f"name: {name}")
                named = True
                continue
            out.append(line)
            continue
        child = _CHILD.match(line)
        if child and section is not None:
            if indent is None:
                indent = child.group(1)
            if child.group(1) == indent and (section, child.group(2)) in todo:
                value = todo.pop((section, child.group(2)))
                out.append(f"{indent}{child.group(2)}:{child.group(3) or ' '}{value}{child.group(5) or ''}")
                continue
        out.append(line)
    for (sec, key), value in todo.items():
        opening = re.compile(rf"^{re.escape(sec)}:\s*(#.*)?$")
        header = next((i for i, line in enumerate(out) if opening.match(line)), None)
        if header is None:
            out += [f"{sec}:", f"  {key}: {value}"]
        else:
            child_indent = next((m.group(1) for line in out[header + 1:]
                                 if (m := _CHILD.match(line)) is not None), "  ")
            out.insert(header + 1, f"{child_indent}{key}: {value}")
    if not named:
        out.insert(0, f"name: {name}")
    return "\n".join(out) + "\n"
