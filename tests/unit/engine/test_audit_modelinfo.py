"""modelinfo: what a config.json says about multimodality, hybrid layers, MTP heads and MoE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor.engine.modelinfo import ModelInfoError, parse_model_config, read_model_dir

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "qwen3.6-27b-like"


def test_qwen36_27b_fixture_reads_as_hybrid_multimodal_dense_with_mtp() -> None:
    info = read_model_dir(FIXTURE)
    assert info.architectures == ("Qwen3_5ForConditionalGeneration",)
    assert info.sglang_multimodal and info.has_vision_config and info.multimodal
    assert info.mm_breakable_graph_ok  # on SGLang's breakable-prefill-graph allow-list
    assert (info.full_attention_layers, info.linear_attention_layers) == (16, 48)
    assert info.hybrid
    assert info.mtp_layers == 1 and info.has_mtp
    assert not info.moe and info.num_experts is None
    assert info.params_estimate is not None
    assert 25e9 < info.params_estimate < 30e9  # a "27B" model
    assert info.weights_bytes_on_disk is None  # the fixture has no weight files
    d = info.to_dict()
    assert d["hybrid_linear_attention"] is True and d["moe"] is False and d["mtp_layers"] == 1


def test_moe_with_nextn_layers_deepseek_style() -> None:
    info = parse_model_config({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 129280,
        "n_routed_experts": 256, "moe_intermediate_size": 2048, "num_nextn_predict_layers": 1,
    })
    assert info.moe and info.num_experts == 256
    assert info.mtp_layers == 1
    assert not info.multimodal and not info.hybrid
    assert info.full_attention_layers == 61


def test_plain_dense_text_model() -> None:
    info = parse_model_config({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 256,
                               "num_hidden_layers": 2, "vocab_size": 1024, "intermediate_size": 512,
                               "num_attention_heads": 4, "tie_word_embeddings": True})
    assert not (info.multimodal or info.hybrid or info.moe or info.has_mtp)
    assert info.params_estimate is not None and info.params_estimate > 0


def test_vision_config_without_sglang_listing_is_noted() -> None:
    info = parse_model_config({"architectures": ["FooForConditionalGeneration"], "vision_config": {}})
    assert info.multimodal and not info.sglang_multimodal
    assert any("not on SGLang" in n for n in info.notes)


def test_nemotron_h_pattern_counts_mamba_layers() -> None:
    info = parse_model_config({"architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 6,
                               "hybrid_override_pattern": "M-M*M-"})
    assert (info.full_attention_layers, info.linear_attention_layers) == (1, 3)


def test_missing_dir_and_bad_json_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelInfoError, match="not a directory"):
        read_model_dir(tmp_path / "nope")
    with pytest.raises(ModelInfoError, match=r"config\.json does not exist"):
        read_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ModelInfoError, match="not valid JSON"):
        read_model_dir(tmp_path)


def test_weight_files_are_summed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model-1.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "model-2.safetensors").write_bytes(b"\0" * 500)
    info = read_model_dir(tmp_path)
    assert info.weights_bytes_on_disk == 1500
    assert info.weights_gb_estimate == pytest.approx(1.5e-6)
