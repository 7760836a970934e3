"""What a model directory's `config.json` says that matters to SGLang's graph and speculative rules.

`parse_model_config` is pure (a dict in, `ModelInfo` out); `read_model_dir` is the thin file adapter.
SGLang decides "multimodal" by architecture name alone (`configs/model_config.py`
`multimodal_model_archs`), not by whether a request carries an image: that is why a text-only
deployment of a VLM can lose its prefill CUDA graph. We keep that list (as of 0.5.23) so the
audit can reproduce SGLang's verdict without importing SGLang.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# sglang 0.5.23 python/sglang/srt/configs/model_config.py: multimodal_model_archs (abridged to the
# families people serve; an arch absent here but carrying a vision_config is still reported).
SGLANG_MULTIMODAL_ARCHS: frozenset[str] = frozenset({
    "CLIPModel", "Cohere2VisionForConditionalGeneration", "DeepseekVL2ForCausalLM",
    "Ernie4_5_VLMoeForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
    "Gemma3ForConditionalGeneration", "Gemma3nForConditionalGeneration",
    "Gemma4ForConditionalGeneration", "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration", "Glm5NextForConditionalGeneration",
    "GlmOcrForConditionalGeneration", "Grok1VForCausalLM", "LlavaLlamaForCausalLM",
    "Llama4ForConditionalGeneration", "LlavaMistralForCausalLM", "LlavaQwenForCausalLM",
    "LlavaForConditionalGeneration", "LlavaVidForCausalLM", "Lfm2VlForConditionalGeneration",
    "MiniCPMO", "MiniCPMV", "Mistral3ForConditionalGeneration", "MultiModalityCausalLM",
    "MllamaForConditionalGeneration", "NemotronH_Nano_VL_V2", "PixtralForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration", "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration", "KimiVLForConditionalGeneration",
    "InternVLChatModel", "InternS1ForConditionalGeneration", "Phi4MMForCausalLM",
    "VoxtralForConditionalGeneration", "WhisperForConditionalGeneration",
    "Step3VLForConditionalGeneration", "DotsVLMForCausalLM", "DotsOCRForCausalLM",
    "DeepseekOCRForCausalLM", "PaddleOCRVLForConditionalGeneration", "KimiK25ForConditionalGeneration",
})

# 0.5.14+: multimodal archs whose LM prefill is validated under the breakable prefill graph
# (`multimodal_breakable_cuda_graph_supported_model_archs`, 0.5.23).
SGLANG_MM_BREAKABLE_GRAPH_ARCHS: frozenset[str] = frozenset({
    "MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration",
    "MiniMaxM3SparseForCausalLM",
})

# <=0.5.13: archs for which the piecewise prefill graph stayed on although multimodal.
SGLANG_MM_PIECEWISE_GRAPH_ARCHS: frozenset[str] = frozenset({
    "KimiK25ForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
})

# Archs whose prefill graph SGLang disables outright (piecewise_cuda_graph_disabled_model_archs).
SGLANG_PREFILL_GRAPH_DISABLED_ARCHS: frozenset[str] = frozenset({
    "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "Qwen3NextForCausalLM",
    "Glm5NextForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "LLaDAModelLM",
})

_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_mtp_layers")
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}


class ModelInfoError(Exception):
    """config.json is missing or unreadable; the message names the path and the fix."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: str
    architectures: tuple[str, ...]
    model_type: str | None
    # SGLang's own verdict (architecture on its multimodal list): what its graph rules look at.
    sglang_multimodal: bool
    has_vision_config: bool
    num_hidden_layers: int | None
    full_attention_layers: int
    linear_attention_layers: int  # linear attention / GDN / mamba / KDA layers (hybrid models)
    mtp_layers: int  # built-in MTP / NEXTN draft layers (0: none)
    num_experts: int | None  # None: dense
    hidden_size: int | None
    vocab_size: int | None
    dtype: str | None
    params_estimate: int | None  # rough parameter count from the shapes (None: shapes missing)
    weights_bytes_on_disk: int | None = None  # sum of *.safetensors/*.bin sizes, when present
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def multimodal(self) -> bool:
        return self.sglang_multimodal or self.has_vision_config

    @property
    def hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    @property
    def moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def has_mtp(self) -> bool:
        return self.mtp_layers > 0

    @property
    def mm_breakable_graph_ok(self) -> bool:
        return any(a in SGLANG_MM_BREAKABLE_GRAPH_ARCHS for a in self.architectures)

    @property
    def weights_gb_estimate(self) -> float | None:
        if self.weights_bytes_on_disk:
            return self.weights_bytes_on_disk / 1e9
        if self.params_estimate is None:
            return None
        return self.params_estimate * _DTYPE_BYTES.get(self.dtype or "bfloat16", 2) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "multimodal": self.multimodal,
            "sglang_multimodal": self.sglang_multimodal,
            "has_vision_config": self.has_vision_config,
            "hybrid_linear_attention": self.hybrid,
            "num_hidden_layers": self.num_hidden_layers,
            "full_attention_layers": self.full_attention_layers,
            "linear_attention_layers": self.linear_attention_layers,
            "mtp_layers": self.mtp_layers,
            "moe": self.moe,
            "num_experts": self.num_experts,
            "dtype": self.dtype,
            "params_estimate_b": None if self.params_estimate is None
            else round(self.params_estimate / 1e9, 2),
            "weights_gb_estimate": None if self.weights_gb_estimate is None
            else round(self.weights_gb_estimate, 2),
        }


def _int(d: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v
    return None


def _layer_kinds(text: Mapping[str, Any], n_layers: int | None) -> tuple[int, int]:
    """(full attention layers, linear/mamba layers) from the several ways configs spell it."""
    types = text.get("layer_types") or text.get("layers_block_type")
    if isinstance(types, list) and types:
        linear = sum(1 for t in types if isinstance(t, str)
                     and any(w in t.lower() for w in ("linear", "mamba", "gdn", "kda", "ssm")))
        return len(types) - linear, linear
    pattern = text.get("hybrid_override_pattern")  # Nemotron-H: "M-M*-..." M = mamba, * = attention
    if isinstance(pattern, str) and pattern:
        return pattern.count("*"), pattern.count("M")
    interval = _int(text, "full_attention_interval")
    if interval and n_layers and any(k.startswith("linear_") for k in text):
        full = n_layers // interval
        return full, n_layers - full
    if isinstance(text.get("linear_attn_config"), Mapping) and n_layers:  # Kimi-Linear KDA
        kda = text["linear_attn_config"].get("kda_layers")
        if isinstance(kda, list):
            return n_layers - len(kda), len(kda)
    mt = str(text.get("model_type") or "").lower()
    if "mamba" in mt and n_layers:
        return 0, n_layers
    return n_layers or 0, 0


def _estimate_params(text: Mapping[str, Any], full: int, linear: int, mtp: int, *,
                     experts: int | None, tied: bool, vision: Mapping[str, Any] | None) -> int | None:
    h = _int(text, "hidden_size")
    vocab = _int(text, "vocab_size")
    n = _int(text, "num_hidden_layers")
    if not (h and vocab and n):
        return None
    heads = _int(text, "num_attention_heads") or 1
    kv = _int(text, "num_key_value_heads") or heads
    hd = _int(text, "head_dim") or h // heads
    gate = 2 if text.get("attn_output_gate") else 1
    attn = h * heads * hd * gate + 2 * h * kv * hd + heads * hd * h
    lk = (_int(text, "linear_num_key_heads") or heads) * (_int(text, "linear_key_head_dim") or hd)
    lv = (_int(text, "linear_num_value_heads") or heads) * (_int(text, "linear_value_head_dim") or hd)
    lin = h * (2 * lk + lv) + h * lv + lv * h
    if experts and experts > 1:
        moe_i = _int(text, "moe_intermediate_size") or _int(text, "intermediate_size") or 4 * h
        shared = _int(text, "shared_expert_intermediate_size") or 0
        mlp = 3 * h * (experts * moe_i + shared)
    else:
        mlp = 3 * h * (_int(text, "intermediate_size") or 4 * h)
    total = full * (attn + mlp) + linear * (lin + mlp) + mtp * (attn + mlp + 2 * h * h)
    total += vocab * h * (1 if tied else 2)
    if vision:
        vh = _int(vision, "hidden_size") or 0
        depth = _int(vision, "depth", "num_hidden_layers") or 0
        vi = _int(vision, "intermediate_size") or 4 * vh
        total += depth * (4 * vh * vh + 2 * vh * vi)
    return total


def parse_model_config(data: Mapping[str, Any], path: str = "") -> ModelInfo:
    """Pure: a parsed config.json (top level; VLMs nest the LM under text_config)."""
    archs = tuple(a for a in data.get("architectures") or () if isinstance(a, str))
    text_raw = data.get("text_config") or data.get("llm_config") or data.get("language_config")
    text: Mapping[str, Any] = text_raw if isinstance(text_raw, Mapping) else data
    merged: dict[str, Any] = {**data, **text}  # text_config wins; top level fills gaps
    vision_raw = data.get("vision_config", data.get("visual"))
    vision = vision_raw if isinstance(vision_raw, Mapping) else None
    n_layers = _int(merged, "num_hidden_layers", "num_layers", "n_layer")
    full, linear = _layer_kinds(merged, n_layers)
    mtp = _int(merged, *_MTP_KEYS) or 0
    experts = _int(merged, *_EXPERT_KEYS)
    dtype = merged.get("dtype") or merged.get("torch_dtype")
    tied = bool(merged.get("tie_word_embeddings", False))
    notes: list[str] = []
    if not archs:
        notes.append("config.json lists no architectures: SGLang cannot pick a model class")
    sglang_mm = any(a in SGLANG_MULTIMODAL_ARCHS for a in archs)
    if vision is not None and not sglang_mm:
        notes.append("has a vision_config but its architecture is not on SGLang 0.5.23's multimodal list")
    return ModelInfo(
        path=path,
        architectures=archs,
        model_type=str(data.get("model_type")) if data.get("model_type") else None,
        sglang_multimodal=sglang_mm,
        has_vision_config=vision is not None,
        num_hidden_layers=n_layers,
        full_attention_layers=full,
        linear_attention_layers=linear,
        mtp_layers=mtp,
        num_experts=experts,
        hidden_size=_int(merged, "hidden_size"),
        vocab_size=_int(merged, "vocab_size"),
        dtype=str(dtype) if dtype else None,
        params_estimate=_estimate_params(merged, full, linear, mtp, experts=experts, tied=tied,
                                         vision=vision),
        notes=tuple(notes),
    )


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_hub_id(model_path: str) -> bool:
    """`org/name` that is not a local path: SGLang downloads it from the Hugging Face Hub."""
    return bool(_HUB_ID.fullmatch(model_path)) and not os.path.exists(model_path)


def read_model_dir(path: str | os.PathLike[str]) -> ModelInfo:
    """Read `<path>/config.json` (and weight file sizes). Raises ModelInfoError with the fix."""
    p = Path(path)
    cfg = p / "config.json"
    if not p.is_dir():
        raise ModelInfoError(f"model path {p} is not a directory: set engine.model_path to the "
                             "downloaded model's directory (the one holding config.json)")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelInfoError(f"{cfg} does not exist: engine.model_path must point at a model "
                             "directory with config.json (finish the download?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelInfoError(f"cannot read {cfg}: {e}") from None
    except json.JSONDecodeError as e:
        raise ModelInfoError(f"{cfg} is not valid JSON (line {e.lineno}): re-download it") from None
    if not isinstance(data, dict):
        raise ModelInfoError(f"{cfg} holds a JSON {type(data).__name__}, not an object: re-download it")
    info = parse_model_config(data, str(p))
    sizes = [f.stat().st_size for f in p.iterdir()
             if f.is_file() and f.suffix in (".safetensors", ".bin", ".gguf")]
    if sizes:
        info = dataclasses.replace(info, weights_bytes_on_disk=sum(sizes))
    return info
