"""SGLang release numbers: parsing, comparing, the releases we hold a flag catalogue for, and the
nearest of them to any other."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

_CATALOG_PACKAGE = "sglang_supervisor.engine.catalog"


def parse_version(s: str) -> tuple[int, ...]:
    """`"0.5.23"` → `(0, 5, 23)`. Suffixes (`0.5.23.post1`, `0.5.24rc0`, `+cu130`) are ignored.

    Raises ValueError naming the text when it does not start with a dotted number.
    """
    parts: list[int] = []
    for piece in s.strip().lstrip("vV").split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    if not parts:
        raise ValueError(f"not a version: {s!r} (expected something like 0.5.23)")
    return tuple(parts)


# The newest release with a flag catalogue (engine/catalog); test_engine_versions keeps it true.
NEWEST_KNOWN_VERSION = "0.5.23"


@lru_cache(maxsize=1)
def known_versions() -> tuple[str, ...]:
    """Versions that have a flag catalogue, sorted oldest first."""
    names = [
        entry.name[len("sglang-") : -len(".json")]
        for entry in resources.files(_CATALOG_PACKAGE).iterdir()
        if entry.name.startswith("sglang-") and entry.name.endswith(".json")
    ]
    return tuple(sorted(names, key=parse_version))


def nearest_known_version(v: str) -> str:
    """The catalogue to use for `v`: the highest known version <= v, else the lowest known."""
    target = parse_version(v)
    known = known_versions()
    older = [k for k in known if parse_version(k) <= target]
    return older[-1] if older else known[0]


def at_least(version: str, floor: str) -> bool:
    return parse_version(version) >= parse_version(floor)
