"""The GPU-bound ~8B dense Qwen3 (dummy weights) that scenarios ab, regress, unexplained and tune
measure on: batch-1 decode reads ~16 GB of weights per token, so a 2 % difference shows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from .adapters import free_port
from .common import build_config
from .context import Context

# Scenarios 9 and 10: an ~8B dense Qwen3 shape with dummy weights. Batch-1 decode is memory-bound
# there (~16 GB of weights read per token), so 2 % is measurable; decode graphs on, prefill eager.
BIG_ARGS: dict[str, Any] = {
    "attention-backend": "triton", "sampling-backend": "pytorch", "grammar-backend": "none",
    "mem-fraction-static": 0.5, "context-length": 8192, "cuda-graph-max-bs-decode": 8,
    "cuda-graph-backend-prefill": "disabled", "load-format": "dummy", "enable-metrics": True,
}
BIG_MODEL = "/tmp/ab8b"


def big_model(ctx: Context) -> str:
    """An ~8B dense Qwen3 config (dummy weights) with the tiny model's tokenizer."""
    if not ctx.real:
        return "Qwen/Qwen3-8B"
    big = Path(BIG_MODEL)
    if not (big / "config.json").exists():
        big.mkdir(parents=True, exist_ok=True)
        for f in os.listdir(ctx.o.model):
            if f.startswith("tokenizer") or f.endswith(".jinja"):
                shutil.copy(os.path.join(ctx.o.model, f), big)
        from transformers import Qwen3Config
        cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                          max_position_embeddings=32768, tie_word_embeddings=False, rms_norm_eps=1e-6,
                          rope_theta=1000000.0)
        cfg.architectures = ["Qwen3ForCausalLM"]
        cfg.dtype = "bfloat16"
        cfg.save_pretrained(big)
    return str(big)


def big_config(ctx: Context, name: str, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    cfg = build_config(engine=ctx.o.engine, python=ctx.o.engine_python, model=big_model(ctx),
                       port=free_port(), metrics_port=free_port(), workdir=ctx.work / name, tp=ctx.o.tp,
                       time_scale=ctx.o.time_scale, profiles=profiles)
    cfg["engine"]["args"] = {**BIG_ARGS, **({"tp-size": ctx.o.tp} if ctx.o.tp > 1 else {})}
    return cfg
