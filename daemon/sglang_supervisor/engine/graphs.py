"""The one model of which CUDA graphs an SGLang command captures, on which rank, per version.

Two readers, one truth: the READY gate (`expected_captures`: which capture lines every rank must
log before the supervisor calls a start good) and the doctor (`graph_phases`: whether each graph
phase is on, why not, and the fix). Both start from `graph_phases`, so the doctor never says a
graph is off while the daemon waits for its capture.

The rules follow SGLang's own resolution (/work/shared/research/sglang-0.5.23-source-notes.md §3
and the 0.5.14 wheel's server_args.py `_parse_cuda_graph_config` / `_apply_cuda_graph_compatibility`):
- <=0.5.13: decode graph unless --disable-cuda-graph; the torch.compile "piecewise" prefill graph
  on by default, off by a rule list that depends on the model and the platform;
  --enforce-piecewise-cuda-graph skips the list. No line says that the piecewise graph is off.
- 0.5.14+: per-phase config. Precedence: --cuda-graph-config JSON > --cuda-graph-backend-* >
  --disable-{prefill,decode}-cuda-graph > --disable-cuda-graph. An explicit prefill backend locks
  it against the auto-disable rules, some rules ignore the lock. The default prefill backend is
  tc_piecewise on 0.5.14 (off by the same rule list as <=0.5.13) and breakable from 0.5.15 (off
  by the breakable rules). Every rank then logs either its prefill capture or
  `Disable prefill CUDA graph because ...`, which settles a prefill capture the gate expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sglang_supervisor.core.events import GraphOwner, GraphPhase
from sglang_supervisor.engine.argv import Flags, parse_flags
from sglang_supervisor.engine.modelinfo import (
    SGLANG_MM_PIECEWISE_GRAPH_ARCHS,
    SGLANG_PREFILL_GRAPH_DISABLED_ARCHS,
    ModelInfo,
)
from sglang_supervisor.engine.sglang import (
    ALIASES_REMOVED,
    PER_PHASE_GRAPHS,
    TC_PIECEWISE_REMOVED,
    at_least,
)

PREFILL_GRAPH_DEFAULT_BREAKABLE = "0.5.15"  # breakable became the CUDA default (tc_piecewise before)
_A2A_BREAKABLE_OK = frozenset({"none", "deepep", "megamoe", "flashinfer"})
_SPEC_WITHOUT_DRAFT_MODEL = frozenset({"NGRAM"})
_EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN"})  # SpeculativeAlgorithm.is_eagle(); NEXTN -> EAGLE


@dataclass(frozen=True)
class PhaseVerdict:
    phase: Literal["decode", "prefill"]
    on: bool
    backend: str | None  # full / breakable / tc_piecewise / piecewise (legacy) / None when off
    reasons: tuple[str, ...]  # why off (or why forced on)
    fix: str = ""
    certain: bool = True  # False: a runtime rule may still turn it off


def _graph_config_json(flags: Flags) -> dict[str, Any]:
    raw = flags.get("--cuda-graph-config")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _phase_backend_from_json(cfg: Mapping[str, Any], phase: str) -> str | None:
    entry = cfg.get(phase)
    if isinstance(entry, Mapping) and isinstance(entry.get("backend"), str):
        return str(entry["backend"])
    return None


def graph_phases(flags: Flags, version: str, model: ModelInfo | None) -> tuple[PhaseVerdict, PhaseVerdict]:
    """(decode, prefill) CUDA graph verdicts with the rules SGLang `version` applies."""
    if not at_least(version, PER_PHASE_GRAPHS):
        return _legacy_decode(flags), _legacy_prefill(flags, model)
    return _decode(flags), _prefill(flags, version, model)


def _decode(flags: Flags) -> PhaseVerdict:
    # SGLang's precedence: JSON > --cuda-graph-backend-decode > --disable-decode-cuda-graph >
    # --disable-cuda-graph; --deepep-mode normal turns both phases off whatever was chosen.
    cfg = _graph_config_json(flags)
    backend = _phase_backend_from_json(cfg, "decode") or flags.get("--cuda-graph-backend-decode")
    fix = "remove it; decode graphs are SGLang's biggest single-stream speed-up (1.58x measured on an H200)"
    if flags.get("--deepep-mode") == "normal":
        return PhaseVerdict(
            "decode",
            False,
            None,
            ("--deepep-mode normal disables both graph phases",),
            "use --deepep-mode auto or low_latency",
        )
    if flags.on("--enable-kv-cache-sharding") and flags.get("--speculative-algorithm") is not None:
        # kv_shard_hook.py (0.5.23): speculative graph capture has no shard plan.
        return PhaseVerdict(
            "decode",
            False,
            None,
            ("--enable-kv-cache-sharding with speculative decoding",),
            "drop --enable-kv-cache-sharding or the speculative algorithm",
        )
    if backend == "disabled":
        return PhaseVerdict(
            "decode",
            False,
            None,
            ("--cuda-graph-backend-decode disabled",),
            "remove --cuda-graph-backend-decode disabled; if capture ran out of memory, "
            "lower --cuda-graph-max-bs-decode or --mem-fraction-static instead",
        )
    if backend is None and flags.on("--disable-decode-cuda-graph"):
        return PhaseVerdict("decode", False, None, ("--disable-decode-cuda-graph",), fix)
    if backend is None and flags.on("--disable-cuda-graph"):
        return PhaseVerdict(
            "decode", False, None, ("--disable-cuda-graph (deprecated: disables both phases)",), fix
        )
    return PhaseVerdict("decode", True, backend or "full", ())


def _prefill(flags: Flags, version: str, model: ModelInfo | None) -> PhaseVerdict:
    """Long because: SGLang's precedence cascade in the order its server_args applies it, first
    match wins (the explicit backend and its aliases, removed tc_piecewise, the disable flags, the
    rules that ignore the lock, the lock, then the auto-disable rules); split, the order that is
    the rule would no longer be readable.
    """
    aliases = not at_least(version, ALIASES_REMOVED)
    cfg = _graph_config_json(flags)
    explicit = _phase_backend_from_json(cfg, "prefill") or flags.get("--cuda-graph-backend-prefill")
    if explicit is None and flags.on("--enforce-piecewise-cuda-graph") and aliases:
        explicit = "tc_piecewise"  # 0.5.14-0.5.19 alias
    if explicit is None and flags.on("--disable-piecewise-cuda-graph") and aliases:
        explicit = "disabled"
    if explicit == "tc_piecewise" and at_least(version, TC_PIECEWISE_REMOVED):
        return PhaseVerdict(
            "prefill",
            False,
            None,
            ("tc_piecewise was removed in 0.5.22 (argparse rejects it)",),
            "--cuda-graph-backend-prefill breakable",
        )
    if explicit == "disabled":
        return PhaseVerdict(
            "prefill",
            False,
            None,
            ("--cuda-graph-backend-prefill disabled",),
            "remove it (breakable is the default on CUDA since 0.5.15)",
        )
    if explicit is None and flags.on("--disable-prefill-cuda-graph"):
        return PhaseVerdict("prefill", False, None, ("--disable-prefill-cuda-graph",), "remove it")
    if explicit is None and flags.on("--disable-cuda-graph"):
        return PhaseVerdict(
            "prefill",
            False,
            None,
            ("--disable-cuda-graph (deprecated: disables both phases)",),
            "remove --disable-cuda-graph",
        )
    # Rules that apply whether or not the backend was set explicitly (they ignore the lock).
    hard: list[str] = []
    if flags.get("--deepep-mode") == "normal":
        hard.append("--deepep-mode normal disables both graph phases")
    if flags.on("--enable-kv-cache-sharding"):
        hard.append("--enable-kv-cache-sharding")
    if flags.get("--moe-a2a-backend") == "deepep_v2":  # moe_hook.py: its prefill is not capturable
        hard.append("--moe-a2a-backend deepep_v2")
    if hard:
        return PhaseVerdict("prefill", False, None, tuple(hard), "drop " + " and ".join(hard))
    soft: list[str] = []
    if flags.on("--enable-lora") or flags.has("--lora-paths"):
        soft.append("LoRA: the capture step turns the prefill graph off for unsupported LoRA setups")
    breakable_default = at_least(version, PREFILL_GRAPH_DEFAULT_BREAKABLE)
    default = "breakable" if breakable_default else "tc_piecewise"
    eagle = _eagle_target_skip(flags, version, explicit or default)
    if eagle:
        return PhaseVerdict("prefill", False, None, (eagle,),
                            "--cuda-graph-backend-prefill breakable (or --enable-return-hidden-states)")
    notes: list[str] = []
    if breakable_default and model is not None and model.sglang_multimodal and model.mm_breakable_graph_ok:
        notes.append(
            f"multimodal, but {model.architectures[0]} is on SGLang's breakable-prefill-graph allow-list"
        )
    if explicit is not None:
        same = " (the default anyway)" if explicit == default else ""
        return PhaseVerdict(
            "prefill",
            True,
            explicit,
            (f"--cuda-graph-backend-prefill {explicit} (locked){same}", *notes, *soft),
            certain=not soft,
        )
    # 0.5.14: the default tc_piecewise graph goes off by the <=0.5.13 rule list.
    off = _breakable_off_rules(flags, model) if breakable_default else _piecewise_off_rules(flags, model)
    if off:
        return _prefill_off(
            off,
            f"--cuda-graph-backend-prefill {default} forces it (locks the choice and skips "
            "these auto-disable rules; test it: SGLang disabled it for a reason)",
        )
    return PhaseVerdict("prefill", True, default, (*notes, *soft), certain=not soft)


def _prefill_off(rules: list[str], fix: str) -> PhaseVerdict:
    """The prefill graph went off by SGLang's auto-disable `rules` (whichever release's list);
    `fix` is the flag that forces it on there."""
    return PhaseVerdict("prefill", False, None, tuple(rules), fix)


def _eagle_target_skip(flags: Flags, version: str, backend: str) -> str | None:
    """0.5.14's model_runner.init_prefill_cuda_graph skips the EAGLE target's prefill graph on
    any backend but breakable (its tc_piecewise graph would be dead and corrupt decode replay,
    SGLang #28386) and logs `Disable prefill CUDA graph for EAGLE target ...` on every rank.
    NEXTN resolves to EAGLE. Gone in 0.5.17; 0.5.15 and 0.5.16 are taken to be as 0.5.17."""
    algo = (flags.get("--speculative-algorithm") or "").upper()
    if (at_least(version, PREFILL_GRAPH_DEFAULT_BREAKABLE) or backend == "breakable"
            or algo not in _EAGLE_FAMILY or flags.on("--enable-return-hidden-states")):
        return None
    return (f"--speculative-algorithm {algo} on the {backend} prefill backend: 0.5.14 skips the "
            "target's prefill graph (SGLang #28386)")


def _breakable_off_rules(flags: Flags, model: ModelInfo | None) -> list[str]:
    """0.5.15+: why the default breakable prefill graph goes off (the rules an explicit
    --cuda-graph-backend-prefill skips)."""
    off: list[str] = []
    if flags.int_of(("--pp-size",), 1) > 1:
        off.append("pipeline parallelism (--pp-size > 1): the prefill graph is opt-in with PP")
    if (flags.int("--dcp-size", 1) or 1) > 1:
        off.append("decode context parallel (--dcp-size > 1)")
    if flags.on("--enable-two-batch-overlap"):
        off.append("two-batch overlap (--enable-two-batch-overlap)")
    a2a = flags.get("--moe-a2a-backend") or "none"
    if a2a not in _A2A_BREAKABLE_OK:
        off.append(f"MoE a2a backend {a2a} is not validated with the breakable graph")
    if model is not None and model.sglang_multimodal and not model.mm_breakable_graph_ok:
        off.append(
            f"multimodal architecture {model.architectures[0]} is not on SGLang's "
            "breakable-prefill-graph allow-list"
        )
    if flags.get("--disaggregation-mode") == "decode":
        off.append("PD disaggregation decode role")
    return off


def _legacy_decode(flags: Flags) -> PhaseVerdict:
    if flags.on("--disable-cuda-graph"):
        return PhaseVerdict("decode", False, None, ("--disable-cuda-graph",), "remove --disable-cuda-graph")
    return PhaseVerdict("decode", True, "full", ())


def _legacy_prefill(flags: Flags, model: ModelInfo | None) -> PhaseVerdict:
    if flags.on("--disable-piecewise-cuda-graph"):
        return PhaseVerdict("prefill", False, None, ("--disable-piecewise-cuda-graph",), "remove it")
    if flags.on("--enforce-piecewise-cuda-graph"):
        return PhaseVerdict(
            "prefill", True, "piecewise", ("--enforce-piecewise-cuda-graph (skips the rule list)",)
        )
    off = _piecewise_off_rules(flags, model)
    if off:
        return _prefill_off(off, "--enforce-piecewise-cuda-graph forces it on this version (test it first)")
    # Without the model's config.json the architecture rules are unknown, and no line says that
    # the piecewise graph went off: on, but not certain.
    return PhaseVerdict("prefill", True, "piecewise", (), certain=model is not None)


def _piecewise_off_rules(flags: Flags, model: ModelInfo | None) -> list[str]:
    """<=0.5.14: why the torch.compile piecewise (tc_piecewise) prefill graph goes off by default
    (`_handle_piecewise_cuda_graph` in 0.5.13, `_disable_tc_piecewise_cudagraph_if_incompatible`
    in 0.5.14: the same list)."""
    rules: list[tuple[bool, str]] = [
        (
            model is not None and any(a in SGLANG_PREFILL_GRAPH_DISABLED_ARCHS for a in model.architectures),
            "architecture on SGLang's piecewise-graph block list",
        ),
        (flags.on("--enable-dp-attention"), "--enable-dp-attention"),
        (flags.on("--enable-torch-compile"), "--enable-torch-compile"),
        (flags.int_of(("--pp-size",), 1) > 1, "pipeline parallelism (--pp-size > 1)"),
        ((flags.get("--device") or "cuda") != "cuda", "a non-CUDA --device"),
        ((flags.get("--moe-a2a-backend") or "none") != "none", "--moe-a2a-backend other than none"),
        (flags.on("--enable-lora") or flags.has("--lora-paths"), "LoRA"),
        (
            model is not None
            and model.sglang_multimodal
            and not any(a in SGLANG_MM_PIECEWISE_GRAPH_ARCHS for a in model.architectures),
            f"multimodal architecture ({model.architectures[0] if model and model.architectures else '?'}): "
            "SGLang classes it as a VLM by its name, whatever the requests are",
        ),
        (flags.get("--load-format") == "gguf", "GGUF weights"),
        (flags.has("--dllm-algorithm"), "diffusion LM (--dllm-algorithm)"),
        (
            (flags.int("--cpu-offload-gb", 0) or 0) > 0 or flags.on("--enable-hierarchical-cache"),
            "CPU offload or hierarchical cache",
        ),
        (flags.on("--enable-deterministic-inference"), "--enable-deterministic-inference"),
        ((flags.get("--disaggregation-mode") or "null") != "null", "PD disaggregation"),
        (flags.on("--enable-symm-mem"), "--enable-symm-mem"),
        (
            flags.on("--enable-eplb") or flags.has("--expert-distribution-recorder-mode"),
            "EPLB / expert recorder",
        ),
        ((flags.int("--attn-cp-size", 1) or 1) > 1, "attention context parallel"),
        (flags.on("--debug-cuda-graph"), "--debug-cuda-graph"),
    ]
    return [reason for hit, reason in rules if hit]


# --------------------------------------------------------------------------------------------
# The READY gate's view: which capture lines a start logs, per rank
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedCapture:
    """One capture (begin + end) that every rank in `ranks` must log before READY.

    A rank is the log prefix (`"TP0"`, `"DP1 TP0"`) or None for tp=1 (no prefix).
    """

    owner: GraphOwner
    phase: GraphPhase
    ranks: tuple[str | None, ...]


def rank_label(tp: int, tp_size: int, dp: int = 0, dp_size: int = 1) -> str | None:
    """SGLang's scheduler log prefix of a rank (`TP1`, `DP0 TP1`); None where it prints none
    (tp_size and dp_size 1). TP ranks are global across the nodes of a multi-node engine."""
    parts = ([f"DP{dp}"] if dp_size > 1 else []) + ([f"TP{tp}"] if tp_size > 1 else [])
    return " ".join(parts) or None


def _rank_labels(tp_size: int, dp_size: int) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
    """(all ranks, rank 0 of each DP group) as the scheduler log prefixes."""
    dps = range(max(dp_size, 1))
    everyone = tuple(rank_label(t, tp_size, d, dp_size) for d in dps for t in range(max(tp_size, 1)))
    rank0 = tuple(rank_label(0, tp_size, d, dp_size) for d in dps)
    return everyone, rank0


def expected_captures(args: Sequence[str], version: str, tp_size: int,
                      model: ModelInfo | None = None) -> list[ExpectedCapture]:
    """The captures a successful start of `args` on `version` logs, per rank (`graph_phases`).

    A prefill graph the verdict calls on is expected even where a rule of the model or the
    runtime may still turn it off: from 0.5.14 each rank then logs `Disable prefill CUDA graph
    because ...`, which settles it (`settled_by_prefill_off`). Before 0.5.14 no line says so,
    so the piecewise graph is expected only where it is certain (--enforce-piecewise-cuda-graph).
    Draft graphs (SGLang.md): draft prefill on every rank with the breakable backend; draft
    decode (only with more than one speculative step) and draft extend on rank 0.
    """
    flags = parse_flags(args)
    decode, prefill = graph_phases(flags, version, model)
    everyone, rank0 = _rank_labels(tp_size, flags.int_of(("--dp-size",), 1))
    algo = (flags.get("--speculative-algorithm") or "").upper()
    speculative = bool(algo)
    draft_model = speculative and algo not in _SPEC_WITHOUT_DRAFT_MODEL
    steps = flags.int("--speculative-num-steps", 0) or 0
    if not at_least(version, PER_PHASE_GRAPHS):
        if not decode.on:
            return []  # <=0.5.13 --disable-cuda-graph: no graph at all
        legacy: list[ExpectedCapture] = []
        if prefill.on and prefill.certain:
            legacy.append(ExpectedCapture("target", "piecewise", everyone))
        legacy.append(ExpectedCapture("target", "legacy", everyone))
        if draft_model:
            legacy.append(ExpectedCapture("draft", "legacy", rank0))
            legacy.append(ExpectedCapture("draft", "extend", rank0))
        return legacy
    expected: list[ExpectedCapture] = []
    if prefill.on:
        expected.append(ExpectedCapture("target", "prefill", everyone))
    if decode.on:
        expected.append(ExpectedCapture("target", "verify" if speculative else "decode", everyone))
    if draft_model:
        if prefill.on and prefill.backend == "breakable":
            expected.append(ExpectedCapture("draft", "prefill", everyone))
        if decode.on and steps > 1:
            expected.append(ExpectedCapture("draft", "decode", rank0))
        if decode.on:
            expected.append(ExpectedCapture("draft", "extend", rank0))
    return expected


def settled_by_prefill_off(phase: str, rank: str | None, said_by: str | None) -> bool:
    """Whether a `Disable prefill CUDA graph because ...` line logged by `said_by` settles the
    expected `phase` capture of `rank`: it covers the target and the draft prefill graph of its
    rank, or of every rank when the unprefixed main process (None) said it."""
    return phase in ("prefill", "piecewise") and (said_by is None or said_by == rank)
