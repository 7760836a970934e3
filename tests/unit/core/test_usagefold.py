"""SGLang's usage text is forwarded as its first line and a count (core/usagefold.py)."""

from __future__ import annotations

from sglang_supervisor.core.usagefold import UsageFold


def forwarded(lines: list[str]) -> list[str]:
    fold = UsageFold()
    out = [text for line in lines for text in fold.take(line)]
    return out + fold.end()


def test_the_indented_lines_after_usage_are_folded_into_one_note() -> None:
    out = forwarded(["start", "usage: serve [-h]", "    [--a A]", "    [--b B]", "serve: error: bad", "next"])
    assert out == ["start", "usage: serve [-h]",
                   "(2 more lines of the engine's usage text are in the engine log file, not forwarded)",
                   "serve: error: bad", "next"]


def test_a_stream_ending_inside_the_usage_text_still_gets_the_note_and_other_text_is_untouched() -> None:
    assert forwarded(["usage: x", "  [--a]"])[-1].startswith("(1 more lines")
    assert forwarded(["  indented", "plain"]) == ["  indented", "plain"]
    assert forwarded(["usage: x", "after"]) == ["usage: x", "after"]  # nothing folded, no note
