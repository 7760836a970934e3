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


# Releases where a behaviour the supervisor depends on changed.
PER_PHASE_GRAPHS = "0.5.14"  # per-phase cuda_graph_config; old flags become deprecated aliases
ALIASES_REMOVED = "0.5.20"  # the deprecated aliases give argparse rc 2
SPEC_V2_IGNORED = "0.5.21"  # SGLANG_ENABLE_SPEC_V2 silently ignored
SPEC_V2_DEFAULT_ON = "0.5.11"  # the overlap-scheduled speculative worker became the default
TC_PIECEWISE_REMOVED = "0.5.22"  # prefill backend tc_piecewise rejected
REQUEST_RECORDS_ON_STDOUT = "0.5.8"  # --log-requests records and access lines go to stdout
CLEAN_DRAIN_EXIT_0 = "0.5.19"  # the drain ends in sys.exit(0), no longer a self-SIGKILL
# initialize_moe_config raises for --enable-single-batch-overlap on any SM 9.x GPU, for every model
# ("Please try removing --enable-single-batch-overlap argument."); 0.5.12 and older accept it.
SBO_REFUSED_ON_SM90 = "0.5.13"
