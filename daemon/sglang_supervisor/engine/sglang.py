"""What the supervisor knows about SGLang, per version: flags, renames, runtime facts.

Everything version-dependent lives here (and in `patterns.py` for log strings) so that the rest of
the daemon asks questions ("which flags does 0.5.23 accept?", "is -9 a clean exit on 0.5.17?")
instead of hard-coding answers that SGLang changes every few releases. This module is the one
place the daemon asks: release numbers are in `versions.py`, the flag catalogues in
`flagcatalog.py`, renames and removals in `migrate.py`; the runtime facts are below.

Flag catalogues are data (`catalog/sglang-<V>.json`), extracted from the PyPI wheels by
`scripts/gen-flag-catalog`; an unlisted version uses the nearest older catalogue.
"""

from __future__ import annotations

from sglang_supervisor.engine.api import HEALTH_ROUTE
from sglang_supervisor.engine.flagcatalog import (
    FlagCatalog,
    FlagProblem,
    FlagSpec,
    Severity,
    flag_catalog,
)
from sglang_supervisor.engine.migrate import ArgMigration, EnvMigration, Migration, migrate_args, migrate_env
from sglang_supervisor.engine.versions import (
    ALIASES_REMOVED,
    CLEAN_DRAIN_EXIT_0,
    NEWEST_KNOWN_VERSION,
    PER_PHASE_GRAPHS,
    REQUEST_RECORDS_ON_STDOUT,
    SPEC_V2_DEFAULT_ON,
    SPEC_V2_IGNORED,
    TC_PIECEWISE_REMOVED,
    at_least,
    known_versions,
    nearest_known_version,
    parse_version,
)

# Release numbers, the flag catalogue and the migrations have their own modules (versions.py,
# flagcatalog.py, migrate.py); the rest of the daemon asks this module, which names them again.
__all__ = [
    "ALIASES_REMOVED",
    "CLEAN_DRAIN_EXIT_0",
    "ENCODER_BOOTSTRAP_PORT_DEFAULT",
    "NEWEST_KNOWN_VERSION",
    "PER_PHASE_GRAPHS",
    "REQUEST_RECORDS_ON_STDOUT",
    "SPEC_ALGORITHMS",
    "SPEC_V2_DEFAULT_ON",
    "SPEC_V2_IGNORED",
    "TC_PIECEWISE_REMOVED",
    "ArgMigration",
    "EnvMigration",
    "FlagCatalog",
    "FlagProblem",
    "FlagSpec",
    "Migration",
    "Severity",
    "at_least",
    "clean_exit_codes",
    "flag_catalog",
    "known_versions",
    "migrate_args",
    "migrate_env",
    "nearest_known_version",
    "parse_version",
]

# --------------------------------------------------------------------------------------------
# Runtime facts
# --------------------------------------------------------------------------------------------


ENCODER_BOOTSTRAP_PORT_DEFAULT = 8997  # --language-only opens it (encoder/LLM disaggregation)
# --speculative-algorithm names SGLang knows (argparse accepts any; the engine fails at startup).
SPEC_ALGORITHMS = frozenset(
    {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP"}
)


def health_path(version: str) -> str:
    """`/health` runs a 1-token generation (about 1 s, 20 s timeout) on every known version."""
    del version  # same route on every known release; kept per-version for the callers' sake
    return HEALTH_ROUTE


def clean_exit_codes(version: str) -> frozenset[int]:
    """Return codes of the launch process that mean "stopped cleanly after our SIGTERM".

    Up to 0.5.17 the drain ends in kill_process_tree(include_parent=True): the launcher
    SIGKILLs itself (-9, seen on the H200 fixtures). From 0.5.19 the source ends the drain
    with include_parent=False and sys.exit(0). 0.5.18 was not checked: treated as the older.
    """
    return frozenset({0}) if at_least(version, CLEAN_DRAIN_EXIT_0) else frozenset({0, -9})
