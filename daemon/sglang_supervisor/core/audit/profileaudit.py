"""Every audit rule for one profile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sglang_supervisor.core.audit.comm import comm_findings, sbo_refusal_findings
from sglang_supervisor.core.audit.features import (
    language_only_findings,
    overlap_findings,
    overlap_schedule_findings,
)
from sglang_supervisor.core.audit.findings import Finding
from sglang_supervisor.core.audit.graphs import graph_findings
from sglang_supervisor.core.audit.speculative import env_findings, spec_findings
from sglang_supervisor.core.gpufacts import GpuInfo, P2PLink
from sglang_supervisor.engine.argv import parse_flags
from sglang_supervisor.engine.modelinfo import ModelInfo
from sglang_supervisor.engine.sglang import (
    FlagCatalog,
)


@dataclass(frozen=True)
class ProfileView:
    """One profile as the doctor sees it."""

    name: str
    args: tuple[str, ...]  # SGLang's own arguments as they will run (after migration)
    env: Mapping[str, str] = field(default_factory=dict)
    written_args: tuple[str, ...] | None = None  # as configured, before any version migration



def audit_profile(
    profile: ProfileView,
    version: str,
    model: ModelInfo | None = None,
    *,
    gpus: Sequence[GpuInfo] = (),
    link: P2PLink | None = None,
    catalog: FlagCatalog | None = None,
) -> list[Finding]:
    """Every audit rule for one profile on SGLang `version`."""
    flags = parse_flags(profile.args, catalog)
    out = graph_findings(flags, version, model, profile.name)
    out += spec_findings(flags, model, profile.name)
    out += language_only_findings(flags, profile.name)
    out += overlap_findings(flags, model, profile.name)
    out += env_findings(profile.env, version, profile.name)
    out += comm_findings(flags, gpus, link, profile.name)
    out += sbo_refusal_findings(flags, gpus, version, profile.name)
    out += overlap_schedule_findings(flags, profile.name)
    return out


