#!/usr/bin/env python3
"""Ground truth for ucp-reshard --format hf's GPT2LMHeadModel and MixtralForCausalLM: run with
transformers itself (the chroot's transformers 5.3, torch 2.6; see scripts/trainer_resume_one.py).

  hf_classes_oracle.py make  OUT_DIR        tiny models, save_pretrained (fp32), and their logits
  hf_classes_oracle.py check NAME LOGITS.json EXPORT_DIR RECORD.json
                                            from_pretrained(EXPORT_DIR) (ucp's export): its loading
                                            report and logits against LOGITS.json's (the model's own),
                                            recorded as RECORD.json[NAME] with the sha256 of every
                                            file transformers read
  launch.py 1 -- hf_classes_oracle.py harness RUN_DIR OUT.json
                                            (the real DeepSpeed harness, /work/shared/real-deepspeed/
                                            harness, DeepSpeed 0.19.5): the logits of BATCH by the
                                            training model itself, its weights loaded by DeepSpeed's
                                            engine.load_checkpoint(load_module_only=True) from
                                            RUN_DIR/ckpt (a train.py run: its model_config.json and
                                            ds_config.json)

make writes OUT_DIR/gpt2_tiny and OUT_DIR/mixtral_tiny: config.json, generation_config.json,
model.safetensors, transformers_logits.json (the logits of BATCH, fp32, as lists). The weights are
drawn (seeded) wider than the classes' initialisers, biases and norm weights included, so that a
tensor taken from the wrong place changes the logits. GPT-2's activation is "gelu" (exact, as
Megatron's F.gelu without --openai-gelu); its sizes are scripts/make_fixture.py's --family gpt model.
"""
import hashlib
import json
import os
import sys

import torch

BATCH = [[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 0]]


def tiny_models():
    from transformers import GPT2Config, GPT2LMHeadModel, MixtralConfig, MixtralForCausalLM
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_inner=128, n_positions=16,
                                      activation_function="gelu", layer_norm_epsilon=1e-5))
    mixtral = MixtralForCausalLM(MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                               num_experts_per_tok=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                                               rope_theta=10000.0, tie_word_embeddings=False))
    return {"gpt2_tiny": gpt2, "mixtral_tiny": mixtral}


def logits_of(model):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(BATCH)).logits.float()


def make(out):
    torch.manual_seed(44)
    for name, model in tiny_models().items():
        with torch.no_grad():
            for pname, p in model.named_parameters():
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.15) + (1.0 if "ln_" in pname or "norm" in pname else 0.0))
        d = os.path.join(out, name)
        model.save_pretrained(d)
        json.dump({"batch": BATCH, "logits": logits_of(model).tolist()}, open(os.path.join(d, "transformers_logits.json"), "w"))
        print(name, sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)), "bytes")


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def harness(run_dir, out):
    """The harness model's logits, built as train.py builds it (MoE groups, AdamW, deepspeed.initialize)."""
    import common
    import deepspeed
    import models
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    common.init_distributed()
    cfg = models.Cfg(json.load(open(os.path.join(run_dir, "model_config.json"))))
    module = models.GPTModel(cfg, models.TP(1, 0, None), zero3=False)
    groups = [{"params": list(module.parameters()), "weight_decay": 0.0, "name": "all"}]
    opt = torch.optim.AdamW(split_params_into_different_moe_groups_for_optimizer(groups), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=opt, config=json.load(open(os.path.join(run_dir, "ds_config.json"))))
    path, _ = engine.load_checkpoint(os.path.join(run_dir, "ckpt"), load_module_only=True, load_optimizer_states=False,
                                     load_lr_scheduler_states=False)
    assert path is not None, "nothing loaded"
    module.eval()
    with torch.no_grad():
        h = module.language_model(torch.tensor(BATCH))
        logits = module.language_model.output_layer(h) if module.untied else module.head(h)
    logits = logits[..., :cfg.vocab_size].float()
    json.dump({"batch": BATCH, "logits": logits.tolist(), "loaded": path}, open(out, "w"))
    print("harness logits", tuple(logits.shape), "from", path)


def check(name, logits_json, export_dir, record_path):
    from transformers import AutoModelForCausalLM
    want = torch.tensor(json.load(open(logits_json))["logits"])
    model, info = AutoModelForCausalLM.from_pretrained(export_dir, output_loading_info=True, dtype=torch.float32)
    got = logits_of(model)
    record = {
        "class": type(model).__name__,
        "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
        "files": {f: sha256(os.path.join(export_dir, f)) for f in sorted(os.listdir(export_dir))
                  if f.endswith((".json", ".safetensors")) and not f.startswith(".")},
        "max_abs_diff": float((got - want).abs().max()),
        "equal": bool(torch.equal(got, want)),
    }
    records = json.load(open(record_path)) if os.path.exists(record_path) else {}
    records[name] = record
    json.dump(records, open(record_path, "w"), indent=1, sort_keys=True)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "harness":
        harness(*sys.argv[2:4])
    else:
        check(*sys.argv[2:6])
