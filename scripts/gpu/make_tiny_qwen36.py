"""Make a tiny model directory of the seed's architecture (Qwen3.6-27B: Qwen3_5ForConditionalGeneration).

The seed's checkpoint, scaled down: the same config keys as Qwen3.6-27B's config.json (hybrid text
model with three Gated-DeltaNet linear-attention layers per full-attention layer, an output-gated
full attention, one MTP layer for NEXTN, a vision tower that makes SGLang classify it as
multimodal), but 4 text layers of hidden size 256 and a 1-block vision tower. No weights are
written: the engine runs it with `--load-format dummy` (random weights, for target and MTP draft
alike), because transformers' Qwen3.5 classes do not hold the MTP layer that NEXTN loads.

A multimodal architecture makes SGLang's tokenizer manager load a processor, so one is saved too
(Qwen3VLProcessor, as the real checkpoint declares), with the vision special tokens in the locally
trained tokenizer. Usage (on the GPU machine): python3 make_tiny_qwen36.py OUT_DIR
"""
import json
import os
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

corpus = ["The quick brown fox jumps over the lazy dog. " * 4, "Hello world, this is a tiny test model for SGLang.",
          "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ !?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`"] * 50
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=special,
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None)
fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
fast.save_pretrained(out)
ids = {t: fast.convert_tokens_to_ids(t) for t in special}
V = 1024  # >= len(tokenizer), multiple of 64

layers = 4
text = {
    "architectures": None, "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True,
    "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "dtype": "bfloat16",
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 256,
    "initializer_range": 0.02, "intermediate_size": 512,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144, "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False, "num_attention_heads": 4, "num_hidden_layers": layers,
    "num_key_value_heads": 2, "output_gate_type": "swish", "pad_token_id": None,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                        "rope_theta": 10000000, "rope_type": "default"},
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": V,
}
del text["architectures"]
config = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
    "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
    "language_model_only": False, "model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False,
    "transformers_version": "4.57.1",
    "vision_config": {"deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh",
                      "hidden_size": 64, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 128,
                      "model_type": "qwen3_5", "num_heads": 2, "num_position_embeddings": 2304,
                      "out_hidden_size": 256, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
with open(os.path.join(out, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}, f)

# The processor the real checkpoint declares (Qwen3VLProcessor); SGLang loads it for a multimodal arch.
try:
    from transformers import Qwen3VLProcessor
    try:
        from transformers import Qwen2VLImageProcessorFast as ImageProcessor
    except ImportError:
        from transformers import Qwen2VLImageProcessor as ImageProcessor  # type: ignore[no-redef]
    kwargs = {"image_processor": ImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
              "tokenizer": fast, "chat_template": fast.chat_template}
    try:
        from transformers import Qwen3VLVideoProcessor
        kwargs["video_processor"] = Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2)
    except ImportError:
        pass
    Qwen3VLProcessor(**kwargs).save_pretrained(out)
    processor = "Qwen3VLProcessor"
except Exception as exc:  # the run then shows what SGLang says without one
    processor = f"none ({type(exc).__name__}: {exc})"
print(json.dumps({"files": sorted(os.listdir(out)), "tokens": len(fast), "processor": processor}))
