"""Single flags that do less, or something else, than their name says."""

from __future__ import annotations

from sglang_supervisor.core.audit.findings import Finding
from sglang_supervisor.engine.argv import Flags
from sglang_supervisor.engine.modelinfo import ModelInfo
from sglang_supervisor.engine.sglang import (
    ENCODER_BOOTSTRAP_PORT_DEFAULT,
)


def language_only_findings(flags: Flags, profile: str) -> list[Finding]:
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


def overlap_findings(flags: Flags, model: ModelInfo | None, profile: str) -> list[Finding]:
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


def overlap_schedule_findings(flags: Flags, profile: str) -> list[Finding]:
    if not flags.on("--disable-overlap-schedule"):
        return []
    return [
        Finding(
            "info",
            "audit",
            "--disable-overlap-schedule turns off CPU/GPU overlap",
            "the scheduler then prepares the next batch only after the GPU finished",
            "remove it unless a bug forces it",
            "overlap_schedule",
            profile,
        )
    ]
