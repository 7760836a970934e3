"""The doctor's rules: pure functions from facts (a profile's argv, the SGLang version, the model's
config.json, host facts, a parser's verdict, a live /server_info) to `Finding`s.

Nothing here does I/O; `commands/doctor.py` gathers the facts. Each rule names what SGLang does
in the version at hand and the exact fix (a flag, a config key, a command), because the reason a
given optimisation is off moves between releases (see docs in the finding texts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sglang_supervisor.core.gpufacts import GpuInfo, P2PLink
from sglang_supervisor.engine import patterns as P
from sglang_supervisor.engine.api import CUDA_GRAPH_PASSES, DECODE_EAGER_MODE, SERVER_INFO_SECRET_KEYS
from sglang_supervisor.engine.argv import Flags, parse_flags
from sglang_supervisor.engine.graphs import graph_phases
from sglang_supervisor.engine.modelinfo import ModelInfo
from sglang_supervisor.engine.sglang import (
    ENCODER_BOOTSTRAP_PORT_DEFAULT,
    PER_PHASE_GRAPHS,
    SPEC_ALGORITHMS,
    SPEC_V2_DEFAULT_ON,
    SPEC_V2_IGNORED,
    FlagCatalog,
    FlagProblem,
    Migration,
    at_least,
)

Severity = Literal["error", "warning", "info", "ok"]
Area = Literal["host", "engine", "audit", "live"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info", "ok")
AREAS: tuple[Area, ...] = ("host", "engine", "audit", "live")



@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    area: Area
    what: str
    why: str
    fix: str = ""
    code: str = ""  # stable identifier, e.g. "graph.prefill.off" (tests, JSON consumers)
    profile: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "severity": self.severity,
            "area": self.area,
            "code": self.code,
            "profile": self.profile,
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
        }


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Stable order: area; config-wide findings before per-profile ones, profiles in the order
    they first appear (the config's ladder order); worst severity first; rule order kept within."""
    items = list(findings)
    first: dict[str | None, int] = {None: -1}
    for f in items:
        first.setdefault(f.profile, len(first))
    return sorted(items, key=lambda f: (AREAS.index(f.area), first[f.profile], SEVERITIES.index(f.severity)))


def collapse_common(findings: Iterable[Finding], profiles: Sequence[str]) -> list[Finding]:
    """A per-profile finding that every profile has, once, as a config-wide finding."""
    items = list(findings)
    if len(profiles) < 2:
        return items
    wanted = set(profiles)
    seen: dict[tuple[str, ...], set[str]] = {}
    for f in items:
        if f.profile is not None:
            seen.setdefault((f.severity, f.area, f.what, f.why, f.fix, f.code), set()).add(f.profile)
    common = {k for k, names in seen.items() if names >= wanted}
    out: list[Finding] = []
    emitted: set[tuple[str, ...]] = set()
    for f in items:
        key = (f.severity, f.area, f.what, f.why, f.fix, f.code)
        if f.profile is None or key not in common:
            out.append(f)
        elif key not in emitted:
            emitted.add(key)
            out.append(Finding(f.severity, f.area, f"{f.what} (every profile)", f.why, f.fix, f.code, None))
    return out


# --------------------------------------------------------------------------------------------
# argv view
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileView:
    """One profile as the doctor sees it."""

    name: str
    args: tuple[str, ...]  # SGLang's own arguments as they will run (after migration)
    env: Mapping[str, str] = field(default_factory=dict)
    written_args: tuple[str, ...] | None = None  # as configured, before any version migration


# --------------------------------------------------------------------------------------------
# CUDA graph phases
# --------------------------------------------------------------------------------------------


def _graph_findings(flags: Flags, version: str, model: ModelInfo | None, profile: str) -> list[Finding]:
    out: list[Finding] = []
    decode, prefill = graph_phases(flags, version, model)
    spec = flags.get("--speculative-algorithm") is not None
    dname = "decode (verify with speculative decoding)" if spec else "decode"
    if decode.on:
        out.append(
            Finding(
                "ok",
                "audit",
                f"{dname} CUDA graph: on (backend {decode.backend})",
                f"no rule of sglang {version} disables it for this profile",
                "",
                "graph.decode.on",
                profile,
            )
        )
    else:
        out.append(
            Finding(
                "warning",
                "audit",
                f"{dname} CUDA graph: OFF",
                "because " + "; ".join(decode.reasons) + ". Every decode step then launches its "
                "kernels one by one: single-stream tok/s drops sharply.",
                decode.fix,
                "graph.decode.off",
                profile,
            )
        )
    legacy = not at_least(version, PER_PHASE_GRAPHS)
    pname = "piecewise prefill CUDA graph" if legacy else "prefill CUDA graph"
    if prefill.on:
        why = "; ".join(prefill.reasons) or f"no auto-disable rule of sglang {version} matches this profile"
        sev: Severity = "ok" if prefill.certain else "info"
        extra = (
            ""
            if prefill.certain
            else f" (a runtime rule may still turn it off; watch for '{P.PREFILL_DISABLED_LINE}' in "
            "the log)"
        )
        out.append(
            Finding(
                sev,
                "audit",
                f"{pname}: on (backend {prefill.backend})",
                why + extra,
                "",
                "graph.prefill.on",
                profile,
            )
        )
    else:
        out.append(
            Finding(
                "warning",
                "audit",
                f"{pname}: OFF",
                "because " + "; ".join(prefill.reasons) + ". Prefill (and time to first token) runs eagerly.",
                prefill.fix,
                "graph.prefill.off",
                profile,
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# Speculative decoding, overlap, disaggregation, env
# --------------------------------------------------------------------------------------------


def _spec_findings(flags: Flags, model: ModelInfo | None, profile: str) -> list[Finding]:
    out: list[Finding] = []
    alg = flags.get("--speculative-algorithm")
    draft_path = flags.get("--speculative-draft-model-path")
    mtp = model is not None and model.has_mtp
    if alg is None:
        if mtp:
            out.append(
                Finding(
                    "info",
                    "audit",
                    "the model has a built-in MTP head that this profile does not use",
                    f"config.json declares {model.mtp_layers if model else 0} MTP/NEXTN layer(s); "
                    "speculative decoding with it usually raises single-stream decode tok/s",
                    "--speculative-algorithm EAGLE --speculative-num-steps 3 "
                    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
                    "spec.mtp_unused",
                    profile,
                )
            )
        return out
    name = alg.upper()
    if name not in SPEC_ALGORITHMS:
        fix = (
            "--speculative-algorithm NEXTN (alias of EAGLE; drafts with the model's own MTP head)"
            if name == "MTP" or mtp
            else "one of " + ", ".join(sorted(SPEC_ALGORITHMS))
        )
        out.append(
            Finding(
                "error",
                "audit",
                f"--speculative-algorithm {alg} is not an algorithm SGLang knows",
                "argparse accepts any name; the engine then fails at startup with "
                f"'{P.UNKNOWN_SPEC_ALGORITHM}: {alg}'"
                + (". MTP is the model feature, not the algorithm's name" if name == "MTP" else ""),
                fix,
                "spec.unknown_algorithm",
                profile,
            )
        )
        return out
    if name == "NEXTN":
        out.append(
            Finding(
                "info",
                "audit",
                "--speculative-algorithm NEXTN is an alias of EAGLE",
                "SGLang resolves NEXTN to EAGLE, drafting with the model's MTP/NEXTN layers",
                "",
                "spec.nextn_alias",
                profile,
            )
        )
    if name in ("EAGLE", "NEXTN") and model is not None and not mtp and draft_path is None:
        out.append(
            Finding(
                "error",
                "audit",
                f"{alg} needs a draft: the model has no MTP/NEXTN head",
                "config.json declares no num_nextn_predict_layers / mtp_num_hidden_layers and no "
                "--speculative-draft-model-path is given",
                "--speculative-draft-model-path <EAGLE draft>, or drop speculative decoding",
                "spec.no_draft",
                profile,
            )
        )
    if name in ("EAGLE3", "STANDALONE") and draft_path is None:
        out.append(
            Finding(
                "error",
                "audit",
                f"{alg} needs --speculative-draft-model-path",
                f"{alg} drafts with a separate model",
                "--speculative-draft-model-path <draft model>",
                "spec.no_draft",
                profile,
            )
        )
    steps = flags.int("--speculative-num-steps")
    topk = flags.int("--speculative-eagle-topk")
    draft = flags.int("--speculative-num-draft-tokens")
    if name in ("EAGLE", "NEXTN", "EAGLE3", "STANDALONE"):
        if steps is None or topk is None or draft is None:
            out.append(
                Finding(
                    "info",
                    "audit",
                    "speculative steps/topk/draft tokens partly unset",
                    "SGLang chooses the missing ones from the model; pin them to compare profiles",
                    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
                    "spec.defaults",
                    profile,
                )
            )
        elif topk == 1 and draft != steps + 1:
            out.append(
                Finding(
                    "warning",
                    "audit",
                    f"--speculative-num-draft-tokens {draft} is not steps + 1 = {steps + 1}",
                    "with --speculative-eagle-topk 1 the draft is a chain: SGLang overrides the value "
                    "to steps + 1 (and logs a warning)",
                    f"--speculative-num-draft-tokens {steps + 1}",
                    "spec.draft_tokens",
                    profile,
                )
            )
        elif topk > 1 and draft > steps * topk + 1:
            out.append(
                Finding(
                    "warning",
                    "audit",
                    f"--speculative-num-draft-tokens {draft} exceeds the draft tree "
                    f"(steps x topk + 1 = {steps * topk + 1})",
                    "the verify step cannot use more tokens than the tree has nodes",
                    f"--speculative-num-draft-tokens {steps * topk + 1} or fewer",
                    "spec.draft_tokens",
                    profile,
                )
            )
        else:
            out.append(
                Finding(
                    "ok",
                    "audit",
                    f"speculative {name}: steps {steps}, topk {topk}, draft tokens {draft}",
                    "consistent",
                    "",
                    "spec.ok",
                    profile,
                )
            )
    return out


def _language_only_findings(flags: Flags, profile: str) -> list[Finding]:
    if not flags.on("--language-only"):
        return []
    port = flags.int("--encoder-bootstrap-port", ENCODER_BOOTSTRAP_PORT_DEFAULT)
    urls = flags.get("--encoder-urls")
    return [
        Finding(
            "warning",
            "audit",
            f"--language-only makes this the LLM side of encoder/LLM disaggregation (opens port {port})",
            "It is not a 'text-only' switch: SGLang starts an encoder bootstrap server on "
            f"--encoder-bootstrap-port ({port}) and expects separate encoder servers "
            f"({'--encoder-urls ' + urls if urls else 'none given with --encoder-urls'}) for images. "
            "Two such instances on one host collide on that port, and it does not bring back the prefill "
            "CUDA graph (that rule looks at the architecture name).",
            "remove --language-only unless you run encoder servers (the vision tower then loads locally; "
            "Qwen3.5-family models have no text-only mode); otherwise give every instance its own "
            "--encoder-bootstrap-port",
            "language_only",
            profile,
        )
    ]


def _overlap_findings(flags: Flags, model: ModelInfo | None, profile: str) -> list[Finding]:
    if not flags.on("--enable-single-batch-overlap"):
        return []
    if model is None:
        return [
            Finding(
                "info",
                "audit",
                "--enable-single-batch-overlap only affects MoE models",
                "only MoE layers read it; the model's config.json was not available to check",
                "",
                "single_batch_overlap",
                profile,
            )
        ]
    if not model.moe:
        return [
            Finding(
                "warning",
                "audit",
                "--enable-single-batch-overlap has no effect on this dense model",
                "SGLang reads it only in MoE layers (compute/communication overlap of expert "
                f"dispatch); {model.architectures[0] if model.architectures else 'the model'} has no "
                "experts, so the flag changes nothing",
                "remove --enable-single-batch-overlap",
                "single_batch_overlap",
                profile,
            )
        ]
    return [
        Finding(
            "ok",
            "audit",
            "--enable-single-batch-overlap on a MoE model",
            f"{model.num_experts} experts: the flag applies",
            "",
            "single_batch_overlap",
            profile,
        )
    ]


def _env_findings(env: Mapping[str, str], version: str, profile: str) -> list[Finding]:
    if "SGLANG_ENABLE_SPEC_V2" not in env:
        return []
    fix = "remove SGLANG_ENABLE_SPEC_V2 from engine.env (or the profile's env)"
    if at_least(version, SPEC_V2_IGNORED):
        return [
            Finding(
                "warning",
                "audit",
                "SGLANG_ENABLE_SPEC_V2 does nothing on sglang " + version,
                f"no code reads it since {SPEC_V2_IGNORED} (silently ignored); speculative decoding "
                "always runs the v2 worker. --disable-overlap-schedule selects the synchronous path",
                fix,
                "env.spec_v2",
                profile,
            )
        ]
    if at_least(version, PER_PHASE_GRAPHS):
        return [
            Finding(
                "warning",
                "audit",
                f"SGLANG_ENABLE_SPEC_V2 was removed in {PER_PHASE_GRAPHS}",
                "SGLang logs that it has been removed; the v2 worker is always used",
                fix,
                "env.spec_v2",
                profile,
            )
        ]
    return [
        Finding(
            "info",
            "audit",
            f"SGLANG_ENABLE_SPEC_V2={env['SGLANG_ENABLE_SPEC_V2']}",
            f"before {PER_PHASE_GRAPHS} it selects the overlap-scheduled speculative worker "
            f"(default on since {SPEC_V2_DEFAULT_ON})",
            "",
            "env.spec_v2",
            profile,
        )
    ]


def _min_cc(gpus: Sequence[GpuInfo]) -> tuple[int, int] | None:
    ccs: list[tuple[int, int]] = []
    for g in gpus:
        if g.compute_capability:
            major, _, minor = g.compute_capability.partition(".")
            ccs.append((int(major), int(minor or 0)))
    return min(ccs) if ccs else None


def _comm_findings(
    flags: Flags, gpus: Sequence[GpuInfo], link: P2PLink | None, profile: str
) -> list[Finding]:
    out: list[Finding] = []
    tp = flags.int("--tp-size", 1) or 1
    used = list(gpus)[:tp] if gpus else []
    cc = _min_cc(used)
    sm = f"SM{cc[0]}{cc[1]}" if cc else "unknown"
    if flags.on("--enable-nccl-nvls") and cc is not None and cc < (9, 0):
        out.append(
            Finding(
                "warning",
                "audit",
                f"--enable-nccl-nvls cannot work on these GPUs ({sm})",
                "NCCL NVLS (NVLink SHARP) needs SM90+ and NVSwitch",
                "remove --enable-nccl-nvls",
                "comm.nvls",
                profile,
            )
        )
    if flags.on("--enable-flashinfer-allreduce-fusion") and cc is not None and cc < (9, 0):
        out.append(
            Finding(
                "warning",
                "audit",
                f"--enable-flashinfer-allreduce-fusion has no effect on {sm}",
                "FlashInfer allreduce fusion needs SM90+",
                "remove --enable-flashinfer-allreduce-fusion",
                "comm.flashinfer_fusion",
                profile,
            )
        )
    if tp <= 1:
        return out
    if cc is None:
        out.append(
            Finding(
                "info",
                "audit",
                "NVLS / FlashInfer allreduce fusion availability unknown",
                "no GPU facts (NVML unavailable): both need SM90+",
                "",
                "comm.unknown",
                profile,
            )
        )
    elif cc >= (9, 0):
        if not flags.on("--enable-nccl-nvls"):
            out.append(
                Finding(
                    "info",
                    "audit",
                    f"{sm}: NCCL NVLS is available to try",
                    "NVLink SHARP speeds up allreduce on NVSwitch systems",
                    "--enable-nccl-nvls (only with NVSwitch)",
                    "comm.nvls",
                    profile,
                )
            )
    else:
        out.append(
            Finding(
                "info",
                "audit",
                f"{sm}: no NVLS and no FlashInfer allreduce fusion here",
                "both need SM90+; custom allreduce is the fast path on these GPUs",
                "",
                "comm.sm",
                profile,
            )
        )
    if flags.on("--disable-custom-all-reduce"):
        if link in ("nvlink", "pcie-p2p"):
            out.append(
                Finding(
                    "warning",
                    "audit",
                    "--disable-custom-all-reduce leaves performance on the table",
                    f"the TP GPUs are linked by {link}: SGLang's custom allreduce beats NCCL for small "
                    "decode messages",
                    "remove --disable-custom-all-reduce",
                    "comm.custom_ar",
                    profile,
                )
            )
    elif link == "none":
        out.append(
            Finding(
                "info",
                "audit",
                "custom allreduce cannot use peer-to-peer here",
                "no NVLink or PCIe P2P between the TP GPUs: SGLang falls back to NCCL",
                "",
                "comm.custom_ar",
                profile,
            )
        )
    elif link in ("nvlink", "pcie-p2p"):
        out.append(
            Finding(
                "ok",
                "audit",
                f"custom allreduce over {link}",
                "TP GPUs can talk peer-to-peer",
                "",
                "comm.custom_ar",
                profile,
            )
        )
    return out


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
    out = _graph_findings(flags, version, model, profile.name)
    out += _spec_findings(flags, model, profile.name)
    out += _language_only_findings(flags, profile.name)
    out += _overlap_findings(flags, model, profile.name)
    out += _env_findings(profile.env, version, profile.name)
    out += _comm_findings(flags, gpus, link, profile.name)
    if flags.on("--disable-overlap-schedule"):
        out.append(
            Finding(
                "info",
                "audit",
                "--disable-overlap-schedule turns off CPU/GPU overlap",
                "the scheduler then prepares the next batch only after the GPU finished",
                "remove it unless a bug forces it",
                "overlap_schedule",
                profile.name,
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# Flags against our catalogue and against the real parser
# --------------------------------------------------------------------------------------------


def catalog_findings(profile: str, version: str, problems: Sequence[FlagProblem]) -> list[Finding]:
    """Our catalogue's verdict on the rendered argv (`profiles.render(...).problems`).

    The speculative-algorithm name and SGLANG_ENABLE_SPEC_V2 are left to the audit rules, which
    say more about them.
    """
    out: list[Finding] = []
    for p in problems:
        if p.flag in ("--speculative-algorithm", "SGLANG_ENABLE_SPEC_V2"):
            continue
        code = (
            "flag.abbreviation"
            if "abbreviation" in p.message
            else "flag.deprecated"
            if "deprecated" in p.message
            else "flag.removed"
            if "removed" in p.message
            else "flag.invalid"
        )
        why = (
            f"argparse of sglang {version} exits with rc 2 on it (unrecognized argument / invalid choice)"
            if p.severity == "error"
            else f"sglang {version} accepts it, but it can hide a typo or go away in a later release"
        )
        out.append(Finding(p.severity, "engine", p.message, why, p.fix, code, profile))
    if not any(f.severity == "error" for f in out):
        out.append(
            Finding(
                "ok",
                "engine",
                f"every rendered flag is known to sglang {version} (our catalogue)",
                "no unknown, removed or ambiguous flags",
                "",
                "flag.catalog_ok",
                profile,
            )
        )
    return out


def migration_findings(profile: str, version: str, migrations: Iterable[Migration]) -> list[Finding]:
    """Flags the config still writes the old way; `render` rewrites them for `version`."""
    out: list[Finding] = []
    for m in migrations:
        old_flag = m.old.split()[0]
        if m.new:
            what = f"{old_flag} is not a flag of sglang {version}: replaced by {m.new}"
            fix = f"write `{m.new}` in the config instead of `{m.old}`"
        else:
            what = f"{old_flag} does nothing on sglang {version}: dropped"
            fix = f"remove `{m.old}` from the config"
        out.append(
            Finding(
                "warning",
                "engine",
                what,
                f"{m.note} (changed in sglang {m.since}). Started as written, sglang would exit with rc 2 "
                "('unrecognized arguments'); the supervisor renders the replacement for you",
                fix,
                "flag.renamed",
                profile,
            )
        )
    return out


def parser_findings(profile: str, result: Mapping[str, Any] | None, version: str | None) -> list[Finding]:
    """One profile's verdict from `engine/argcheck.py` (the real parser in the engine's interpreter)."""
    if result is None:
        return []
    out: list[Finding] = []
    if result.get("error"):
        out.append(
            Finding(
                "error",
                "engine",
                f"the real sglang {version or ''} parser rejects this profile",
                str(result["error"]),
                "fix the flag it names",
                "parser.error",
                profile,
            )
        )
    unknown = [t for t in result.get("unknown") or [] if isinstance(t, str)]
    if unknown:
        out.append(
            Finding(
                "error",
                "engine",
                "the real sglang parser does not know: " + " ".join(unknown),
                "sglang would exit with rc 2: 'unrecognized arguments'",
                "remove or rename those flags (see the catalogue findings for replacements)",
                "parser.unknown",
                profile,
            )
        )
    for short, full in (result.get("abbreviations") or {}).items():
        out.append(
            Finding(
                "warning",
                "engine",
                f"{short} is accepted only as an abbreviation" + (f" of {full}" if full else ""),
                "argparse expands unique prefixes silently; a typo can hide the same way",
                f"write {full or 'the full option'}",
                "parser.abbreviation",
                profile,
            )
        )
    if not out:
        out.append(
            Finding(
                "ok",
                "engine",
                f"the real sglang {version or ''} parser accepts this profile",
                "ServerArgs.add_cli_args + parse_known_args found no unknown flag",
                "",
                "parser.ok",
                profile,
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# Host
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    nvml: bool
    gpus: tuple[GpuInfo, ...] = ()
    foreign: tuple[str, ...] = ()  # "GPU0 pid 123 (python3 train.py) 40.0 GiB" lines
    # The running engine's own GPU processes (of the server on the engine port): "our engine (pid
    # 31, sglang::scheduler_TP0) on GPU0, 70.0 GiB" lines, and the bytes it holds per GPU index
    # (memory a restart of the engine gets back).
    engine_gpu: tuple[str, ...] = ()
    engine_gpu_bytes: Mapping[int, int] = field(default_factory=dict)
    tp_link: P2PLink | None = None
    shm_bytes: int | None = None
    memlock_soft: int | None = None  # -1: unlimited
    ports_busy: Mapping[int, str] = field(default_factory=dict)  # port -> what it is for
    # busy ports held by a running SGLang or sglang-supervisor: port -> who (pid, started by whom)
    ports_running: Mapping[int, str] = field(default_factory=dict)
    ports_checked: Mapping[int, str] = field(default_factory=dict)
    # path -> (what it is for, 'ok' | 'missing' | 'unwritable: <reason>')
    dirs: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    model: ModelInfo | None = None
    model_error: str | None = None


_GIB = 1024**3


def host_findings(h: HostFacts, tp_size: int, mem_fraction: float | None = None) -> list[Finding]:
    out: list[Finding] = []
    if not h.nvml:
        out.append(
            Finding(
                "warning",
                "host",
                "NVML is not available: GPU checks skipped",
                "no NVIDIA driver/library here (or no GPU); the audit continues without GPU facts",
                "run doctor on the GPU host",
                "host.nvml",
            )
        )
    else:
        for g in h.gpus:
            free = (
                (g.memory_total_bytes - g.memory_used_bytes)
                if (g.memory_total_bytes is not None and g.memory_used_bytes is not None)
                else None
            )
            out.append(
                Finding(
                    "info",
                    "host",
                    f"GPU{g.index}: {g.name}, SM {g.compute_capability or '?'}, "
                    f"driver {g.driver or '?'}"
                    + (
                        f", {free / _GIB:.1f} of {(g.memory_total_bytes or 0) / _GIB:.1f} GiB free"
                        if free is not None
                        else ""
                    ),
                    "",
                    "",
                    "host.gpu",
                )
            )
        if len(h.gpus) < tp_size:
            out.append(
                Finding(
                    "error",
                    "host",
                    f"--tp-size {tp_size} needs {tp_size} GPUs; {len(h.gpus)} visible",
                    "SGLang starts one scheduler per GPU",
                    f"--tp-size {len(h.gpus) or 1}, or check CUDA_VISIBLE_DEVICES",
                    "host.gpu_count",
                )
            )
        for line in h.engine_gpu:
            out.append(
                Finding(
                    "info",
                    "host",
                    line,
                    "a process of the SGLang serving the engine port; its memory is counted as free "
                    "below",
                    "",
                    "host.engine_gpu",
                )
            )
        for line in h.foreign:
            out.append(
                Finding(
                    "warning",
                    "host",
                    f"foreign GPU process: {line}",
                    "another process holds GPU memory: the engine may not fit (the supervisor then exits "
                    "75 and systemd retries)",
                    "stop it, or lower --mem-fraction-static",
                    "host.foreign",
                )
            )
        model = h.model
        if model is not None and model.weights_gb_estimate and h.gpus[:tp_size]:
            per_gpu = model.weights_gb_estimate * 1e9 / tp_size
            frees = [(g.memory_total_bytes or 0) - (g.memory_used_bytes or 0)
                     + h.engine_gpu_bytes.get(g.index, 0) for g in h.gpus[:tp_size]]
            budget = min(frees) * (mem_fraction or 0.9)
            if per_gpu > budget:
                out.append(
                    Finding(
                        "error",
                        "host",
                        f"the weights (~{per_gpu / _GIB:.1f} GiB per GPU) do not fit",
                        f"{budget / _GIB:.1f} GiB per GPU usable at mem fraction {mem_fraction or 0.9}",
                        "more GPUs (--tp-size), a quantized model, or free the GPUs",
                        "host.memory",
                    )
                )
    if tp_size > 1:
        if h.tp_link in ("nvlink", "pcie-p2p"):
            out.append(Finding("ok", "host", f"TP GPUs linked by {h.tp_link}", "", "", "host.link"))
        elif h.tp_link == "none":
            out.append(
                Finding(
                    "warning",
                    "host",
                    "no peer-to-peer link between the TP GPUs",
                    "every allreduce goes through host memory: tensor parallel decode is slow",
                    "check the PCIe topology / IOMMU (nvidia-smi topo -m)",
                    "host.link",
                )
            )
    if h.shm_bytes is not None and tp_size > 1 and h.shm_bytes < _GIB:
        out.append(
            Finding(
                "warning",
                "host",
                f"/dev/shm is only {h.shm_bytes / 2**20:.0f} MiB",  # noqa: S108 (a fact, not a file)
                "NCCL uses shared memory between ranks; small /dev/shm (containers: 64 MiB) breaks "
                "or slows multi-GPU runs",
                "remount /dev/shm bigger (docker: --shm-size 16g)",
                "host.shm",
            )
        )
    if h.memlock_soft is not None and h.memlock_soft != -1 and h.memlock_soft < 64 * 2**20:
        out.append(
            Finding(
                "info",
                "host",
                f"RLIMIT_MEMLOCK is {h.memlock_soft // 1024} KiB",
                "pinned host memory (NCCL, CPU offload) prefers unlimited locked memory",
                "LimitMEMLOCK=infinity in the unit",
                "host.memlock",
            )
        )
    for port, what in h.ports_busy.items():
        if port in h.ports_running:
            out.append(
                Finding(
                    "info",
                    "host",
                    f"port {port} ({what}): {h.ports_running[port]}",
                    "doctor checks the host as if nothing ran; a running service holds its own ports",
                    "nothing to do if that is this service; otherwise stop that server before starting "
                    "this one, or give this one another port",
                    "host.port_running",
                )
            )
            continue
        out.append(
            Finding(
                "error",
                "host",
                f"port {port} ({what}) is already in use",
                "the engine (or its side server) cannot bind it and exits",
                "stop the other listener or change the port in the config",
                "host.port",
            )
        )
    free_ports = [f"{p} ({w})" for p, w in h.ports_checked.items() if p not in h.ports_busy]
    if free_ports:
        out.append(Finding("ok", "host", "ports free: " + ", ".join(free_ports), "", "", "host.port"))
    for path, (purpose, status) in h.dirs.items():
        if status == "ok":
            out.append(Finding("ok", "host", f"{purpose} {path} is writable", "", "", "host.dir"))
        elif status == "missing":
            out.append(
                Finding(
                    "info",
                    "host",
                    f"{purpose} {path} does not exist yet",
                    "the unit's StateDirectory=/LogsDirectory=/RuntimeDirectory= create it at start",
                    f"when running by hand: install -d -o <service user> {path}",
                    "host.dir",
                )
            )
        else:
            out.append(
                Finding(
                    "warning",
                    "host",
                    f"{purpose} {path} is not writable by this user",
                    status + " (fine if the service runs as another user who can write it)",
                    f"chown it to the service user (install -d -o <user> {path})",
                    "host.dir",
                )
            )
    if h.model_error:
        out.append(
            Finding(
                "error",
                "host",
                "model config unreadable",
                h.model_error,
                "fix engine.model_path",
                "host.model",
            )
        )
    elif h.model is not None:
        m = h.model
        traits = [
            (
                "multimodal (SGLang classes it as a VLM)"
                if m.sglang_multimodal
                else "has a vision tower"
                if m.has_vision_config
                else "text-only"
            ),
            f"hybrid: {m.linear_attention_layers} linear-attention + "
            f"{m.full_attention_layers} full-attention layers"
            if m.hybrid
            else "standard attention",
            f"MTP/NEXTN head: {m.mtp_layers} layer(s)" if m.has_mtp else "no MTP head",
            f"MoE: {m.num_experts} experts" if m.moe else "dense",
        ]
        size = f", ~{m.params_estimate / 1e9:.1f}B params" if m.params_estimate else ""
        out.append(
            Finding(
                "info",
                "host",
                f"model {', '.join(m.architectures) or '?'}{size}",
                "; ".join(traits) + ("; " + "; ".join(m.notes) if m.notes else ""),
                "",
                "host.model",
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# Live server
# --------------------------------------------------------------------------------------------


def redact_server_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """Copy of /server_info with secrets replaced (SGLang returns --api-key in clear)."""

    def scrub(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {k: ("<redacted>" if k in SERVER_INFO_SECRET_KEYS and v else scrub(v))
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [scrub(x) for x in obj]
        return obj

    out: dict[str, Any] = scrub(info)
    return out


def live_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    states = info.get("internal_states") or [{}]
    st = states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    mem = st.get("memory_usage") if isinstance(st.get("memory_usage"), Mapping) else {}
    return {
        "version": info.get("version"),
        "model_path": info.get("model_path"),
        "tp_size": info.get("tp_size"),
        "speculative_algorithm": info.get("speculative_algorithm"),
        "cuda_graph_backend_decode": info.get("cuda_graph_backend_decode"),
        "cuda_graph_backend_prefill": info.get("cuda_graph_backend_prefill"),
        "last_gen_throughput": st.get("last_gen_throughput"),
        "avg_spec_accept_length": st.get("avg_spec_accept_length"),
        "memory_usage": mem,
        "max_total_num_tokens": info.get("max_total_num_tokens"),
    }


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def live_findings(info: Mapping[str, Any], decode_none_passes: float | None = None) -> list[Finding]:
    """Evidence from a running server: resolved args, graph memory, throughput, accept length."""
    out: list[Finding] = []
    s = live_summary(info)
    version = str(s["version"] or "?")
    thr = _num(s["last_gen_throughput"])
    out.append(
        Finding(
            "info",
            "live",
            f"sglang {version} serving {s['model_path']}: last gen throughput "
            + (f"{thr:.1f} tok/s" if thr is not None else "unknown"),
            "from /server_info internal_states[0]",
            "",
            "live.summary",
        )
    )
    mem = s["memory_usage"] or {}
    graph = mem.get("graph") if isinstance(mem.get("graph"), Mapping) else None
    decode_disabled = (
        info.get("disable_cuda_graph") is True
        or info.get("disable_decode_cuda_graph") is True
        or info.get("cuda_graph_backend_decode") == "disabled"
    )
    if info.get("disable_piecewise_cuda_graph") is True:  # <=0.5.13 resolved field
        out.append(
            Finding(
                "warning",
                "live",
                "the running server resolved disable_piecewise_cuda_graph=True",
                "one of SGLang's auto-disable rules (multimodal architecture, LoRA, PP, ...) turned the "
                "piecewise prefill graph off; doctor --config names the rule",
                f"--enforce-piecewise-cuda-graph before {PER_PHASE_GRAPHS}, --cuda-graph-backend-prefill "
                "breakable on newer",
                "live.piecewise_off",
            )
        )
    spec = bool(s["speculative_algorithm"])
    decode_key = "target_verify" if spec else "decode"
    graph_mem = _num(graph.get(decode_key)) if graph else None
    if decode_disabled or (graph_mem is not None and graph_mem == 0.0):
        evidence = (
            "the resolved args disable it"
            if decode_disabled
            else f"memory_usage.graph.{decode_key} is 0 GB (no graph was captured)"
        )
        out.append(
            Finding(
                "warning",
                "live",
                "the running server decodes WITHOUT CUDA graphs",
                evidence,
                "remove the flag that disables decode graphs and restart (doctor --config shows which)",
                "live.decode_eager",
            )
        )
    elif graph_mem is not None:
        out.append(
            Finding(
                "ok",
                "live",
                f"{decode_key} CUDA graph captured ({graph_mem:.3f} GB)",
                "",
                "",
                "live.decode_graph",
            )
        )
    if graph is not None:
        prefill_mem = _num(graph.get("prefill"))
        if prefill_mem == 0.0:
            out.append(
                Finding(
                    "warning",
                    "live",
                    "no prefill CUDA graph was captured",
                    "memory_usage.graph.prefill is 0 GB",
                    "see the audit's prefill graph finding",
                    "live.prefill_eager",
                )
            )
    if decode_none_passes:
        out.append(
            Finding(
                "warning",
                "live",
                f"{decode_none_passes:.0f} decode passes ran eagerly",
                f"{CUDA_GRAPH_PASSES}{{mode={DECODE_EAGER_MODE}}} > 0: batches fell outside the "
                "captured sizes",
                "raise --cuda-graph-max-bs-decode to the concurrency you serve",
                "live.decode_none",
            )
        )
    acc = _num(s["avg_spec_accept_length"])
    if spec and acc is not None:
        sev: Severity = "warning" if acc < 1.5 else "ok"
        out.append(
            Finding(
                sev,
                "live",
                f"speculative accept length {acc:.2f}",
                "below 1.5 the draft costs more than it saves"
                if sev == "warning"
                else "drafts are paying off",
                "fewer --speculative-num-steps or no speculation" if sev == "warning" else "",
                "live.spec_accept",
            )
        )
    return out
