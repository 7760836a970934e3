"""The simulator's throughput model: profile -> decode tok/s. Pure functions, no I/O.

Calibration (the shape, not a benchmark):
- The seed: a dense 27B model on two workstation GPUs (tp=2) decodes ~50-57 tok/s with 3-step
  NEXTN, ~35-40 with 1 step. Without speculative decoding that box gives ~25 tok/s.
- Real H200 runs (tests/fixtures/sglang-0.5.17-h200): CUDA graphs vs eager are 1.58x on a 2-layer
  model (530 vs 335 tok/s) and 2.5x on a 64-layer 32B shape (55.9 vs 22.4 tok/s): eager adds a
  roughly fixed kernel-launch cost per layer and step (~0.4 ms), which hurts short steps most.
- Batching: 8 streams gave ~7.4x the single-stream decode rate on the tiny model.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

# Effective bytes/s one workstation GPU streams weights at, fitted so that 27B bf16 (54 GB) at
# tp=2 gives ~25 tok/s without speculative decoding.
_GPU_EFFECTIVE_GBPS = 675.0
_MAX_BASE_TPS = 530.0  # tiny models are bound by per-step overhead, not bandwidth (H200 fixture)
_EAGER_S_PER_LAYER = 0.00042
_EAGER_S_FIXED = 0.0003
_DRAFT_ACCEPT_P = 0.8  # probability the next draft token is accepted (NEXTN/EAGLE, topk 1)
_DRAFT_STEP_COST = 0.15  # one draft step costs this fraction of a target decode step
_BATCH_ALPHA = 0.012  # per-extra-stream slowdown of a decode step
_PREFILL_SPEEDUP = 120.0  # prefill tokens/s relative to single-stream decode tok/s


@dataclass(frozen=True, slots=True)
class Profile:
    model_gb: float
    tp_size: int = 1
    decode_graph: bool = True
    prefill_graph: bool = True
    spec_steps: int = 0  # 0: no speculative decoding
    spec_draft_tokens: int = 0
    spec_topk: int = 1
    max_running_requests: int = 4096
    base_tps: float | None = None  # override: single-stream tok/s with graphs, no spec


def model_gb_from_path(model_path: str) -> float:
    """Guess the bf16 weight size from a name like `Qwen3.6-27B` or `Llama-3-8b-fp8`."""
    name = model_path.rstrip("/").rsplit("/", 1)[-1]
    matches = re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", name)
    if not matches:
        return 1.0  # unknown: behave like a small model
    billions = float(matches[-1])
    bytes_per_param = 1.0 if re.search(r"fp8|int8|w8", name, re.IGNORECASE) else 2.0
    if re.search(r"awq|gptq|int4|fp4|w4", name, re.IGNORECASE):
        bytes_per_param = 0.5
    return billions * bytes_per_param


def num_layers(model_gb: float) -> int:
    """A plausible layer count for timing: 2 for toy models, 64 for ~60 GB."""
    return max(2, min(96, round(math.sqrt(model_gb) * 8.2)))


def base_tps(p: Profile) -> float:
    """Single-stream tok/s with decode CUDA graphs, no speculative decoding."""
    if p.base_tps is not None:
        return p.base_tps
    per_gpu_gb = max(p.model_gb / max(p.tp_size, 1), 0.01)
    return min(_MAX_BASE_TPS, _GPU_EFFECTIVE_GBPS / per_gpu_gb)


def accept_length(p: Profile) -> float:
    """Mean tokens emitted per verify step (1.0 without speculative decoding)."""
    if p.spec_steps <= 0:
        return 1.0
    steps = min(p.spec_steps, max(p.spec_draft_tokens - 1, 1)) if p.spec_draft_tokens else p.spec_steps
    return sum(_DRAFT_ACCEPT_P**i for i in range(steps + 1))


def step_seconds(p: Profile, concurrency: int = 1, eager: bool | None = None) -> float:
    """Seconds for one decode (or draft+verify) step of a batch of `concurrency` streams."""
    graph_step = 1.0 / base_tps(p)
    use_eager = (not p.decode_graph) if eager is None else eager
    step = graph_step
    if use_eager:
        step += _EAGER_S_FIXED + _EAGER_S_PER_LAYER * num_layers(p.model_gb)
    if p.spec_steps > 0:
        step *= 1.0 + _DRAFT_STEP_COST * p.spec_steps
    running = max(1, min(concurrency, p.max_running_requests))
    return step * (1.0 + _BATCH_ALPHA * (running - 1))


def per_stream_tps(p: Profile, concurrency: int = 1, eager: bool | None = None) -> float:
    return accept_length(p) / step_seconds(p, concurrency, eager)


def single_stream_tps(p: Profile, eager: bool | None = None) -> float:
    """The "true rate" a one-stream probe should measure (decode only, no prefill)."""
    return per_stream_tps(p, 1, eager)


def aggregate_tps(p: Profile, concurrency: int, eager: bool | None = None) -> float:
    """Total tok/s over `concurrency` streams; streams beyond max_running_requests queue."""
    running = max(1, min(concurrency, p.max_running_requests))
    return running * per_stream_tps(p, running, eager)


def prefill_seconds(p: Profile, tokens: int) -> float:
    """Time to first token for a prompt; prefill graphs help short prompts a little."""
    rate = base_tps(p) * _PREFILL_SPEEDUP
    overhead = 0.004 if p.prefill_graph else 0.008
    return overhead + tokens / rate


def describe(p: Profile) -> dict[str, object]:
    """The true rates, for /server_info's `sim` key and `--help`."""
    return {
        "profile": asdict(p),
        "accept_length": round(accept_length(p), 3),
        "single_stream_tps": round(single_stream_tps(p), 2),
        "single_stream_tps_eager": round(single_stream_tps(p, eager=True), 2),
        "aggregate_tps": {str(c): round(aggregate_tps(p, c), 1) for c in (1, 2, 4, 8, 16, 32)},
    }
