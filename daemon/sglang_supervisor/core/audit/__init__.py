"""The doctor's rules: pure functions from facts (a profile's argv, the SGLang version, the model's
config.json, host facts, a parser's verdict, a live /server_info) to `Finding`s.

Nothing here does I/O; `commands/doctor.py` gathers the facts. Each rule names what SGLang does
in the version at hand and the exact fix (a flag, a config key, a command), because the reason a
given optimisation is off moves between releases (see docs in the finding texts).

One module per family of rules: `findings` (the type, its order, folding), `profileaudit` (every rule
for one profile: `graphs`, `speculative`, `features`, `comm`), `flags` (catalogue, migrations, the
real parser), `host`, `live`, `fallback` and `codestale` (the supervisor's /status). This module
is the doctor's one entry point to them.
"""

from sglang_supervisor.core.audit.codestale import code_stale_findings
from sglang_supervisor.core.audit.fallback import fallback_findings, fidelity_findings
from sglang_supervisor.core.audit.findings import (
    AREAS,
    SEVERITIES,
    Area,
    Finding,
    Severity,
    collapse_common,
    has_errors,
    sort_findings,
)
from sglang_supervisor.core.audit.flags import catalog_findings, migration_findings, parser_findings
from sglang_supervisor.core.audit.host import HostFacts, host_findings
from sglang_supervisor.core.audit.live import live_findings, live_summary, redact_server_info
from sglang_supervisor.core.audit.profileaudit import ProfileView, audit_profile
from sglang_supervisor.core.audit.releases import release_findings

__all__ = [
    "AREAS",
    "SEVERITIES",
    "Area",
    "Finding",
    "HostFacts",
    "ProfileView",
    "Severity",
    "audit_profile",
    "catalog_findings",
    "code_stale_findings",
    "collapse_common",
    "fallback_findings",
    "fidelity_findings",
    "has_errors",
    "host_findings",
    "live_findings",
    "live_summary",
    "migration_findings",
    "parser_findings",
    "redact_server_info",
    "release_findings",
    "sort_findings",
]
