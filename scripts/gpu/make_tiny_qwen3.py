"""Make a tiny random Qwen3 model dir offline (tokenizer trained on the spot + config + bf16 weights).

Copied unchanged in behaviour from the project notes tools/sglang-gpu/make_tiny_qwen3.py (the script
that made the model behind tests/fixtures/sglang-0.5.17-h200/): 2 layers, hidden 256, vocab 1024.
Usage: python3 make_tiny_qwen3.py OUT_DIR
"""
import json
import os
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config

corpus = ["The quick brown fox jumps over the lazy dog. " * 4, "Hello world, this is a tiny test model for SGLang.",
          "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ !?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`"] * 50
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
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
V = 1024  # >= len(tokenizer), multiple of 64
cfg = Qwen3Config(vocab_size=V, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                  eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=fast.eos_token_id)
cfg.architectures = ["Qwen3ForCausalLM"]
cfg.dtype = "bfloat16"
try:
    import torch
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(out, safe_serialization=True)   # writes config.json + model.safetensors
except ImportError:
    cfg.save_pretrained(out)                          # config only -> use --load-format dummy
print(sorted(os.listdir(out)), len(fast))
