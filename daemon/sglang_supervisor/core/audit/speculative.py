"""Speculative decoding: the algorithm's name, its draft, steps/topk/draft tokens, SGLANG_ENABLE_SPEC_V2."""

from __future__ import annotations

from collections.abc import Mapping

from sglang_supervisor.core.audit.findings import Finding
from sglang_supervisor.engine import patterns as P
from sglang_supervisor.engine.argv import Flags
from sglang_supervisor.engine.modelinfo import ModelInfo
from sglang_supervisor.engine.sglang import (
    PER_PHASE_GRAPHS,
    SPEC_ALGORITHMS,
    SPEC_V2_DEFAULT_ON,
    SPEC_V2_IGNORED,
    at_least,
)

_DRAFTING = ("EAGLE", "NEXTN", "EAGLE3", "STANDALONE")


def spec_findings(flags: Flags, model: ModelInfo | None, profile: str) -> list[Finding]:
    alg = flags.get("--speculative-algorithm")
    mtp = model is not None and model.has_mtp
    if alg is None:
        return [_mtp_unused(model, profile)] if mtp else []
    name = alg.upper()
    if name not in SPEC_ALGORITHMS:
        return [_unknown_algorithm(alg, name, mtp, profile)]
    out = _draft_findings(flags, alg, model, profile)
    if name in _DRAFTING:
        out.append(_shape_finding(flags, name, profile))
    return out


def _mtp_unused(model: ModelInfo | None, profile: str) -> Finding:
    return Finding(
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


def _unknown_algorithm(alg: str, name: str, mtp: bool, profile: str) -> Finding:
    fix = (
        "--speculative-algorithm NEXTN (alias of EAGLE; drafts with the model's own MTP head)"
        if name == "MTP" or mtp
        else "one of " + ", ".join(sorted(SPEC_ALGORITHMS))
    )
    return Finding(
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


def _draft_findings(flags: Flags, alg: str, model: ModelInfo | None, profile: str) -> list[Finding]:
    """Where the draft comes from: the model's own MTP head (NEXTN/EAGLE) or a separate model."""
    out: list[Finding] = []
    name = alg.upper()
    mtp = model is not None and model.has_mtp
    draft_path = flags.get("--speculative-draft-model-path")
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
    return out


def _shape_finding(flags: Flags, name: str, profile: str) -> Finding:
    """Steps, topk and draft tokens against each other (a chain when topk is 1, else a tree)."""
    steps = flags.int("--speculative-num-steps")
    topk = flags.int("--speculative-eagle-topk")
    draft = flags.int("--speculative-num-draft-tokens")
    if steps is None or topk is None or draft is None:
        return Finding(
            "info",
            "audit",
            "speculative steps/topk/draft tokens partly unset",
            "SGLang chooses the missing ones from the model; pin them to compare profiles",
            "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            "spec.defaults",
            profile,
        )
    if topk == 1 and draft != steps + 1:
        return Finding(
            "warning",
            "audit",
            f"--speculative-num-draft-tokens {draft} is not steps + 1 = {steps + 1}",
            "with --speculative-eagle-topk 1 the draft is a chain: SGLang overrides the value "
            "to steps + 1 (and logs a warning)",
            f"--speculative-num-draft-tokens {steps + 1}",
            "spec.draft_tokens",
            profile,
        )
    if topk > 1 and draft > steps * topk + 1:
        return Finding(
            "warning",
            "audit",
            f"--speculative-num-draft-tokens {draft} exceeds the draft tree "
            f"(steps x topk + 1 = {steps * topk + 1})",
            "the verify step cannot use more tokens than the tree has nodes",
            f"--speculative-num-draft-tokens {steps * topk + 1} or fewer",
            "spec.draft_tokens",
            profile,
        )
    return Finding(
        "ok",
        "audit",
        f"speculative {name}: steps {steps}, topk {topk}, draft tokens {draft}",
        "consistent",
        "",
        "spec.ok",
        profile,
    )


def env_findings(env: Mapping[str, str], version: str, profile: str) -> list[Finding]:
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

