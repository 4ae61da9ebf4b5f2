"""--format hf on a checkpoint that does not say its model (a plain DeepSpeed engine saves no Megatron
args): the generator's Llama-shaped checkpoint without args (scripts/make_fixture.py --no-args; the
generator knows the model it wrote: hidden 32, 2 layers, 4 heads, 2 key-value heads, FFN 48, tied).

    hf_model_facts.py UCP_BIN_DIR WORK

- Without --model-config: one refusal naming every fact the weights cannot show (normalization, position
  embeddings, heads, context length, the norms' epsilon, the rotary base), with a --model-config to fill in; the facts the weights show
  (hidden size, layers, FFN width, key-value heads, SwiGLU) are not asked for.
- With those facts: written, and config.json holds the generator's model, the derived facts said as notes;
  the tied output layer is no tensor of its own (tie_word_embeddings true).
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish  # noqa: E402

BIN, WORK = sys.argv[1:3]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


shutil.rmtree(WORK, ignore_errors=True)
src, atomic = os.path.join(WORK, "src"), os.path.join(WORK, "atomic")
subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_fixture.py"), src, "--tp", "2", "--dp", "1",
                "--family", "llama", "--no-args", "--dtype", "fp32"], check=True, capture_output=True)
subprocess.run([os.path.join(BIN, "ucp-convert"), src, "-o", atomic, "-q"], check=True)
reshard = os.path.join(BIN, "ucp-reshard")

r = subprocess.run([reshard, atomic, "-o", os.path.join(WORK, "hf"), "--format", "hf"], capture_output=True, text=True)
asked = ["normalization", "position_embedding_type", "num_attention_heads", "max_position_embeddings", "layernorm_epsilon",
         "rope_theta", "--model-config"]
shown = ["hidden_size", "num_layers", "ffn_hidden_size", "swiglu", "num_key_value_heads"]
check("no args: one refusal asking for every fact the weights do not show", r.returncode == 1 and
      all(k in r.stderr for k in asked) and r.stderr.count("error:") == 1, r.stderr[-600:])
check("no args: not asked for what the weights show", not any(k in r.stderr for k in shown), r.stderr[-600:])
check("no args: nothing written", not os.path.exists(os.path.join(WORK, "hf", "config.json")))

facts = os.path.join(WORK, "facts.json")
json.dump({"normalization": "rmsnorm", "position_embedding_type": "rope", "num_attention_heads": 4,
           "max_position_embeddings": 64, "layernorm_epsilon": 1e-6, "rope_theta": 500000.0}, open(facts, "w"))
r = subprocess.run([reshard, atomic, "-o", os.path.join(WORK, "hf"), "--format", "hf", "--model-config", facts],
                   capture_output=True, text=True)
check("with --model-config: written", r.returncode == 0, r.stderr[-600:])
if r.returncode == 0:
    c = json.load(open(os.path.join(WORK, "hf", "config.json")))
    want = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 48, "head_dim": 8, "vocab_size": 100, "tie_word_embeddings": True,
            "max_position_embeddings": 64, "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0}
    check("config.json: the generator's model", all(c.get(k) == v for k, v in want.items()),
          str({k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}))
    check("derived facts said as notes", all(f"note: {k} is not in the checkpoint's args" in r.stderr for k in shown), r.stderr[-800:])
    index = json.load(open(os.path.join(WORK, "hf", "model.safetensors.index.json")))
    check("tied: no lm_head tensor", "lm_head.weight" not in index["weight_map"] and "model.embed_tokens.weight" in index["weight_map"])
finish()
