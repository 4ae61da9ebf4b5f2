"""Tiny LlamaForCausalLM models made by transformers itself (save_pretrained), for ucp's import tests.

Runs where `transformers` is installed (the Debian trixie chroot, tests/hf/README.md), not CI:
    python make_llama_models.py OUT_DIR
writes OUT_DIR/llama_fp32 (one model.safetensors), llama_bf16 (tied word embeddings), llama_sharded (fp32,
max_shard_size 200KB: shards and model.safetensors.index.json), each with transformers' logits of the fixed
batch (transformers_check.py's IDS) in transformers_logits.json, recorded by transformers_check.py --record.
Random weights from a fixed seed; GQA (4 query heads, 2 key-value heads); each folder under 1 MB.
"""
import os
import subprocess
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

MODELS = {  # name: (dtype, tied, max_shard_size)
    "llama_fp32": (torch.float32, False, None),
    "llama_bf16": (torch.bfloat16, True, None),
    "llama_sharded": (torch.float32, False, "200KB"),
}


def main():
    out = sys.argv[1]
    for seed, (name, (dtype, tied, shard)) in enumerate(MODELS.items()):
        torch.manual_seed(seed)
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=320, max_position_embeddings=64, rms_norm_eps=1e-5,
                             tie_word_embeddings=tied)
        model = LlamaForCausalLM(config).to(dtype).eval()
        with torch.no_grad():  # the norms away from 1, so that a norm read wrong shows in the logits
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
        d = os.path.join(out, name)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, **kwargs)
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, os.path.join(here, "transformers_check.py"), "--record", d,
                        os.path.join(d, "transformers_logits.json")], check=True)


if __name__ == "__main__":
    main()
