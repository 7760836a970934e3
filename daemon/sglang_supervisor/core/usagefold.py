"""SGLang's usage text, forwarded to the journal once as its first line and a count.

A refused flag makes argparse print `usage: launch_server.py [-h] ...` and some 500 indented
lines of options before `error: ...`: one failed start would bury the journal (issue 28). The
engine log file keeps every line; the journal gets the usage line, one note saying how many lines
were folded, and the error, which is what names the flag.
"""

from __future__ import annotations

USAGE_PREFIX = "usage: "


class UsageFold:
    """Fed the engine's forwarded lines in order; says which to forward. Cheap to skip: call it only
    while `folding` or for a line that starts with USAGE_PREFIX."""

    def __init__(self) -> None:
        self.folding = False
        self.folded = 0

    def take(self, line: str) -> list[str]:
        if self.folding:
            if line[:1].isspace():  # argparse indents every continuation of the usage text
                self.folded += 1
                return []
            return [*self.end(), line]
        if line.startswith(USAGE_PREFIX):
            self.folding, self.folded = True, 0
        return [line]

    def end(self) -> list[str]:
        """The note for a block that just ended (another line came, or the stream closed)."""
        if not self.folding:
            return []
        self.folding = False
        if not self.folded:
            return []
        return [f"({self.folded} more lines of the engine's usage text are in the engine log file, "
                "not forwarded)"]
