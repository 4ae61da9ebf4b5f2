"""Writes a real Megatron-Core `torch_dist` training checkpoint on CPU (gloo, TP*PP*DP processes): a tiny
GPTModel trained a few Adam steps, saved by Megatron-Core's own `dist_checkpointing.save` with the
state dict Megatron-LM's `generate_state_dict` builds (model, optimizer.sharded_state_dict, iteration,
checkpoint_version, args, scheduler, RNG state). Then torch's own DCP loader reads the checkpoint's
global tensors into reference.pt (the tests' ground truth), and what `torch.load` finds in common.pt goes
to common.json (REFERENCES_ONLY=1 redoes only these two).

Run inside the Debian trixie chroot with Megatron-LM core_v0.17.1 on PYTHONPATH:
  CASE=llama_tp2 OUT=/tmp/mcore python3 make_mcore.py
Cases with an FP32Optimizer (2 processes): gpt_tp2 (LayerNorm, GeLU, biases, MHA, learned positions,
untied output layer; TP=2), gpt_tp2_tied (the same with the output layer tied to the word embedding),
llama_tp2 (RMSNorm, SwiGLU, GQA 4 heads / 2 groups, rotary, no biases; TP=2), llama_pp2 (the same model, PP=2:
each stage saves its own layers of the stacked tensors), moe_ep2 (the same block with 4 experts, top-2,
EP=2); llama_tp2_legacy (llama_tp2's kind, smaller, with the legacy form beside, see below).
Cases with Megatron's DistributedOptimizer over its DDP (`distopt`): llama_dp2_distopt_bf16 (bf16
weights, DP=2), llama_tp2_dp2_distopt_bf16 (TP=2 x DP=2), llama_pp2_dp2_distopt_bf16 (PP=2 x DP=2),
gpt_dp2_distopt_fp32 (the GPT-shaped model in fp32, no weight a multiple of 64 elements,
overlap_grad_reduce with bucket_size 4000: several buckets, 64-element alignment padding between
parameters). Each saves the same trained state twice, from the same process: checkpoint/ in the
fully_reshardable form and checkpoint_dp_reshardable/ in the dp_reshardable form (each with the metadata
and args Megatron-LM's save_checkpoint would use: `_build_sharded_state_dict_metadata`, content_metadata),
writes buckets.json (Megatron's own bucket and parameter layout on every rank), then loads both
checkpoints into fresh models and optimizers (dist_checkpointing.load, as Megatron-LM's load_checkpoint)
and compares them with each other and with the trained state; and compares the trained state, gathered
from every rank's shards, with reference.pt (reference_trained.pt where they differ).
The Llama distopt cases and llama_tp2_legacy also write legacy/: Megatron-LM's own save_checkpoint with
--ckpt-format torch (iter_0000003/mp_rank_TT[_PPP]/model_optim_rng.pt, distrib_optim.pt beside it with
the distributed optimizer, latest_checkpointed_iteration.txt), then read it back as Megatron-LM's
load_checkpoint does and compare with the trained state.
gpt_tp2_pp2_bf16_legacy: the GPT block (built from its args) in bf16 without the distributed optimizer, TP=2 x PP=2
(4 processes, seeded gradients): DDP (grad_reduce_in_fp32) and get_megatron_optimizer's
Float16OptimizerWithFloat16Params (fp32 main params; torch_dist saves them as optimizer.state.fp32_param.*), saved as
Megatron-LM's save_checkpoint would (its metadata and content_metadata) and in the legacy form; both loaded back into
fresh models and optimizers and compared (float16_checks; train.log also shows the legacy optimizer dict's structure).
It also writes checkpoint_weights_only/: Megatron-LM's own save_checkpoint with --ckpt-format torch_dist --no-save-optim
(save_weights_only: model, args, iteration, checkpoint_version, RNG state; no optimizer, no scheduler), its iter_0000003
folder renamed; loaded back with dist_checkpointing.load (strict RAISE_ALL) into a fresh model and compared bitwise
(weights_only_check, WEIGHTS-ONLY LOAD CHECK).
gpt_dp2_buckets_legacy: gpt_dp2_distopt_fp32's kind (fp32, DistributedOptimizer, DP=2, overlap_grad_reduce with
bucket_size 4000: 8 buckets) with the legacy form beside; the args saved in common.pt (both forms) and in
model_optim_rng.pt are checked against the bucket size DDP used (saved_bucket_args).
llama_dp2_distopt_dp_reshardable: the old model (hidden 64) saved only in the dp_reshardable form, for
the folder once refused in tests/data/real-dcp-refused (removed: the form is read now).
bench_llama_dp2_distopt_bf16: a large llama_dp2_distopt_bf16 for scripts/benchmark.py, not committed (made on
demand): its sizes from BENCH_HIDDEN (1024), BENCH_FFN (2816), BENCH_LAYERS (4), BENCH_VOCAB (20000),
BENCH_HEADS (16), BENCH_GROUPS (4): 86 M parameters, a checkpoint_dp_reshardable/ of 1.2 GB (bf16 weights and
fp32 main param, exp_avg, exp_avg_sq); overlap_grad_reduce with DDP's default bucket_size (40 M elements:
2 buckets); STEPS defaults to 1. It writes only checkpoint_dp_reshardable/ (no fully_reshardable checkpoint/,
legacy/, buckets.json, load check, reference.pt or common.json).
The GPT cases are built as Megatron-LM's pretrain_gpt.py builds them: the args are parse_args of the
flags, validate_args and the tokenizer's padded_vocab_size (gpt_args, as initialize_megatron), the
TransformerConfig Megatron-LM's own core_transformer_config_from_args of them, the local layer spec and
GPTModel's arguments as gpt_builders.gpt_builder gives them (gpt_model); those args are the ones saved.
So the model computes what its args say: bias_gelu_fusion (Megatron-LM's default with biases) makes
bias_activation_fusion, the MLP's bias_gelu_impl, GeLU's tanh approximation. train.log says the config,
the args and the activation measured in layer 0's MLP (describe), and how far exact GeLU's logits would be.
The Llama-style and MoE cases keep a hand-written TransformerConfig (config) beside unvalidated args, but
moe_tp2_ep2_logits: moe_ep2's block (4 experts, top-2 softmax router, SequentialMLP, allgather dispatcher) built
from its args as the GPT cases are (FROM_ARGS), TP=2 x EP=2 (4 processes; expert TP 2, expert DP 1, dense DP 2),
2 layers, ffn 40 per expert, init std 0.2, FP32Optimizer, checkpoint/ and legacy/ (its LEGACY LOAD CHECK) and
megatron_logits.json (the config's router settings beside ids and logits; mixtral_check.py compares transformers'
MixtralForCausalLM with them). Megatron-Core refuses to train its MoE layer at TP > 1 without sequence
parallelism, which the local spec's torch RMSNorm refuses: its gradients are seeded (equal on a parameter's
replicas); the logits are an eval-mode forward (the refusal is for training only).
The flattened fully_sharded_model_space form cannot be saved by 0.17.1 itself ("ShardedTensor.
flattened_range is not supported"): only older releases wrote it.

CPU-only workarounds, in this process only: Megatron-Core's save calls torch.cuda.synchronize() and
torch.cuda.current_device(); FP32Optimizer makes its loss scale with device='cuda'; the default causal
mask is made on cuda (a mask is given); the RNG tracker's fork needs a CUDA generator (a no-op fork:
dropout is 0). For the distributed optimizer also (cuda_to_cpu): allocations asking for cuda get the
CPU, CUDA streams are no-ops, a CPU tensor's type() answers as its CUDA twin. For the load checks: a
fresh optimizer first takes Megatron's own _init_optimizer_states_with_dummy_values, and torch Adam's
per-parameter step is kept out of _set_main_param_and_optimizer_states (step_kept_apart). For the legacy
save: torch.cuda.get_rng_state gives 16 zero bytes (save_legacy). For the GPT cases: validate_args asks
the GPU's architecture (answered 9, with CUDA_DEVICE_MAX_CONNECTIONS=1 set: gpt_args), and Megatron's
jit_fuser (torch.compile, which needs a C++ compiler on CPU) is made eager by torch._dynamo.config.disable
(worker): the fused bias-GeLU and bias-dropout-add run as the same Python functions, unfused.
"""
import contextlib, os, sys, json, traceback
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F

CASE = os.environ.get("CASE", "llama_tp2")
OUT = os.environ.get("OUT", "/tmp/mcore")
CKPT = os.path.join(OUT, CASE, "checkpoint")
CKPT_DP = os.path.join(OUT, CASE, "checkpoint_dp_reshardable")
LEGACY_DIR = os.path.join(OUT, CASE, "legacy")  # Megatron-LM's --ckpt-format torch form of the same state
# gpt_tp2_pp2_bf16_legacy: Megatron-LM's save_checkpoint with --ckpt-format torch_dist --no-save-optim writes
# WEIGHTS_SAVE/iter_0000003 (and WEIGHTS_SAVE/latest_checkpointed_iteration.txt); that iter folder becomes
# checkpoint_weights_only/ (weights_only)
WEIGHTS_SAVE = os.path.join(OUT, CASE, "weights_only_save")
CKPT_WEIGHTS = os.path.join(OUT, CASE, "checkpoint_weights_only")
BENCH = CASE.startswith("bench_")  # bench_llama_dp2_distopt_bf16: large, checkpoint_dp_reshardable/ only
STEPS = int(os.environ.get("STEPS", "1" if BENCH else "3"))
# gpt_dp2_buckets_legacy: gpt_dp2_distopt_fp32's kind (several buckets) with the legacy form beside
BUCKETS = CASE == "gpt_dp2_buckets_legacy"
DISTOPT = "distopt" in CASE or BUCKETS  # Megatron's DistributedOptimizer over DDP
# gpt_tp2_pp2_bf16_legacy: bf16 parameters without the distributed optimizer, so get_megatron_optimizer
# gives Float16OptimizerWithFloat16Params (fp32 main params beside the bf16 model) over DDP's grad buffers
FLOAT16 = "_bf16" in CASE and not DISTOPT
ONLY_DP = "dp_reshardable" in CASE  # the old case: the dp_reshardable form only, in checkpoint/
FORM = "dp_reshardable" if ONLY_DP else "fully_reshardable"  # checkpoint/'s form
BOTH = DISTOPT and not ONLY_DP  # both forms of the same state, buckets.json, the load check
GPT = CASE.startswith("gpt")  # built as Megatron-LM builds it: the config from the parsed and validated args
# moe_tp2_ep2_logits: moe_ep2's Llama-style MoE block built from its args as the GPT cases are (FROM_ARGS), at
# TP=2 x EP=2 (4 processes: expert TP = TP = 2, expert DP 1, dense DP 2), with the legacy form and its logits
MOE_ARGS = CASE == "moe_tp2_ep2_logits"
# moe_ep2_chained: moe_ep2's block as Megatron-LM's training builds its optimizer at EP > 1: DDP, then
# get_megatron_optimizer, which chains a dense and an expert FP32Optimizer (ChainedOptimizer), saved with the
# metadata Megatron-LM's save_checkpoint gives sharded_state_dict (_build_sharded_state_dict_metadata:
# chained_optim_avoid_prefix) and its content_metadata. moe_ep1_dp2: the same at EP 1 (DP 2), where the experts
# are not expert-parallel and get_megatron_optimizer builds one FP32Optimizer of Megatron's 2 default groups.
# moe_ep2_dp4_distopt_bf16: the usual bf16 MoE run at EP > 1: DDP, then get_megatron_optimizer with the distributed
# optimizer, which chains a dense DistributedOptimizer (its buckets over the DP group of 4) and an expert one (over
# the expert DP group of 2), saved in both forms as the other distopt cases (checkpoint/, checkpoint_dp_reshardable/)
# moe_ep1_dp2_distopt_bf16: the same at EP 1, where one DistributedOptimizer holds the experts in the dense buckets
# moe_tp2_ep2_distopt_bf16, moe_pp2_ep2_distopt_bf16: the chain at TP=2 (expert TP 2) and at PP=2, each x DP=2
# (expert DP 1), with seeded gradients (SEEDED)
MEGATRON_OPT = CASE in ("moe_ep2_chained", "moe_ep1_dp2", "moe_ep2_dp4_distopt_bf16", "moe_ep1_dp2_distopt_bf16",
                        "moe_tp2_ep2_distopt_bf16", "moe_pp2_ep2_distopt_bf16")
FROM_ARGS = GPT or MOE_ARGS
TIED = CASE.endswith("_tied")  # gpt_tp2_tied: the output layer is the word embedding (no --untie-embeddings-and-output-weights)
# The legacy form beside: the Llama distributed-optimizer cases, and llama_tp2_legacy (an FP32Optimizer
# at TP=2 like llama_tp2, smaller; llama_tp2 itself is not regenerated: a rerun here changes its low bits).
LEGACY = ((BOTH and not GPT and not MEGATRON_OPT) or CASE.endswith("_legacy") or MOE_ARGS) and not BENCH
BF16 = (DISTOPT and not CASE.endswith("fp32") and not BUCKETS) or FLOAT16
TP = 2 if "tp2" in CASE else 1
PP = 2 if "pp2" in CASE else 1
EP = 1 if "_ep1" in CASE else 2 if CASE.startswith("moe") else 1  # experts over the 2 ranks: the global-expert axis
DP = 4 if "dp4" in CASE else 2 if "dp2" in CASE or CASE.startswith("moe") else 1
WORLD = TP * PP * DP
# Seeded gradients instead of a loss: no pipeline schedule on CPU (PP > 1); Megatron-Core refuses to train its MoE
# layer at TP > 1 without sequence parallelism, which the local spec's torch norms refuse (see MOE_ARGS in worker)
SEEDED = PP > 1 or (CASE.startswith("moe") and TP > 1)
# Sizes: the distributed optimizer's new cases are smaller (each folder holds three copies of the state).
LAYERS, HEADS, GROUPS, OVERLAP = 4, 4, 2, False  # OVERLAP: overlap_grad_reduce with DDP's default bucket_size
if BENCH:  # the benchmark's sizes: 86 M parameters by default, a checkpoint_dp_reshardable/ of 1.2 GB
    env = lambda name, default: int(os.environ.get("BENCH_" + name, default))
    HIDDEN, FFN, VOCAB, BUCKET = env("HIDDEN", 1024), env("FFN", 2816), env("VOCAB", 20000), None
    LAYERS, HEADS, GROUPS, OVERLAP = env("LAYERS", 4), env("HEADS", 16), env("GROUPS", 4), True
elif BOTH and GPT:  # no weight a multiple of 64 elements: padding between parameters; buckets of >= 4000 elements
    HIDDEN, FFN, VOCAB, BUCKET = 28, 56, 100, 4000
elif MOE_ARGS or MEGATRON_OPT:  # 2 layers of 4 experts, ffn 40 per expert: the folder (checkpoint/, legacy/, reference.pt) under
    # 2.5 MB (2.60 MB with ffn 48)
    HIDDEN, FFN, VOCAB, BUCKET, LAYERS = 32, 40, 64, None, 2
elif FLOAT16:  # the GPT block at TP=2 x PP=2: 4 heads (2 per TP rank), 2 layers per stage
    HIDDEN, FFN, VOCAB, BUCKET = 32, 64, 64, None
elif BOTH or LEGACY:
    HIDDEN, FFN, VOCAB, BUCKET = 32, 48, 64, None
elif GPT:  # gpt_tp2, gpt_tp2_tied: ffn 4 x hidden (validate_args' default), each folder under 2 MB
    HIDDEN, FFN, VOCAB, BUCKET = 32, None, 128, None
else:
    HIDDEN, FFN, VOCAB, BUCKET = 64, 96, 128, None


def cuda_to_cpu():
    """For the distributed optimizer on CPU only: Megatron's DDP buffers and DistributedOptimizer allocate
    on 'cuda', use CUDA streams and accept only 'torch.cuda.*Tensor' types. In this process, allocations
    asking for cuda get the CPU, streams are no-ops, and a CPU tensor's type() answers as its CUDA twin."""
    def fix(kw):
        if "cuda" in str(kw.get("device", "")):
            kw["device"] = "cpu"
        return kw
    for name in ("zeros", "empty", "ones", "tensor", "full", "arange", "zeros_like", "empty_like", "ones_like"):
        setattr(torch, name, (lambda orig: lambda *a, **k: orig(*a, **fix(k)))(getattr(torch, name)))
    to = torch.Tensor.to
    torch.Tensor.to = lambda self, *a, **k: to(self, *("cpu" if "cuda" in str(x) else x for x in a), **fix(k))
    torch.Tensor.cuda = lambda self, *a, **k: self
    kind = torch.Tensor.type
    torch.Tensor.type = lambda self, *a, **k: (kind(self).replace("torch.", "torch.cuda.", 1) if not a and not k else kind(self, *a, **k))

    class Stream:
        def __init__(self, *a, **k): pass
        def wait_stream(self, *a, **k): pass
    torch.cuda.Stream = Stream
    torch.cuda.current_stream = torch.cuda.default_stream = lambda *a, **k: Stream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()


def config():
    """The hand-written TransformerConfig of the Llama-style and MoE cases (their args are parse_args of the
    matching flags). The GPT cases' config is Megatron-LM's own, from their args: gpt_model()."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    common = dict(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, use_cpu_initialization=True,
                  pipeline_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
                  tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP)
    if FFN is not None:
        common.update(ffn_hidden_size=FFN)
    if CASE.startswith("moe"):  # Mixture of Experts: 4 experts, top-2, on the Llama-style block
        common.update(num_moe_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.0, expert_model_parallel_size=EP)
    if BF16:
        common.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    return TransformerConfig(**common, num_query_groups=GROUPS, normalization="RMSNorm", gated_linear_unit=True,
                             activation_func=F.silu, add_bias_linear=False), "rope"


def megatron_args(fully_reshardable=True, legacy=False, weights_only=False):
    """The args Megatron-LM's pretrain_gpt.py would parse for this model (its parse_args; unvalidated but for
    the GPT cases, see gpt_args); legacy: with --ckpt-format torch --save LEGACY_DIR instead of torch_dist;
    weights_only: torch_dist with --save WEIGHTS_SAVE --save-interval STEPS --no-save-optim."""
    sys.argv = ["pretrain_gpt.py", "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS),
                "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                "--lr", "1e-3", "--min-lr", "1e-5", "--weight-decay", "0.01", "--adam-beta2", "0.95",
                "--ckpt-format", "torch" if legacy else "torch_dist", "--tensor-model-parallel-size", str(TP),
                "--pipeline-model-parallel-size", str(PP), "--hidden-dropout", "0", "--attention-dropout", "0"]
    if not TIED:
        sys.argv += ["--untie-embeddings-and-output-weights"]
    if FROM_ARGS:  # what a CPU run of pretrain_gpt.py without Apex or Transformer Engine needs (the local spec, no
        # fused wgrad kernel, no persistent LayerNorm kernel: torch's LayerNorm, weights made on the CPU) and the
        # vocabulary Megatron-LM's mock-data setup gives: a NullTokenizer of VOCAB - 1 ids plus its
        # end-of-document id, padded to a multiple of make_vocab_size_divisible_by x TP = VOCAB
        sys.argv += ["--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
                     "--use-cpu-initialization",
                     "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB - 1),
                     "--make-vocab-size-divisible-by", str(VOCAB // TP)]
        if not DISTOPT:  # gpt_tp2, gpt_tp2_tied (and moe_tp2_ep2_logits: router logits far from uniform): 10 x Megatron's default std, so that the MLP's inputs reach where
            # exact and tanh GeLU part: their logits would be ~1e-3 apart (~1e-6 at 0.02), megatron_logits.json tells them apart
            sys.argv += ["--init-method-std", "0.2"]
    if DISTOPT:
        sys.argv += ["--use-distributed-optimizer"] + (["--bf16"] if BF16 else [])
        if BOTH and BF16:  # DDP's grad_reduce_in_fp32
            sys.argv += ["--accumulate-allreduce-grads-in-fp32"]
        if BUCKET:
            sys.argv += ["--overlap-grad-reduce", "--ddp-bucket-size", str(BUCKET)]
        elif OVERLAP:  # DDP's default bucket_size
            sys.argv += ["--overlap-grad-reduce"]
        if fully_reshardable and not legacy:
            sys.argv += ["--dist-ckpt-optim-fully-reshardable"]
    if FLOAT16:  # validate_args then sets accumulate_allreduce_grads_in_fp32 (DDP's grad_reduce_in_fp32)
        sys.argv += ["--bf16"]
    if legacy:  # the GPT cases' validate_args wants a --save-interval with --save
        sys.argv += ["--save", LEGACY_DIR] + (["--save-interval", str(STEPS)] if FROM_ARGS else [])
    if weights_only:  # save_checkpoint's torch_dist save without the optimizer and the scheduler
        sys.argv += ["--save", WEIGHTS_SAVE, "--save-interval", str(STEPS), "--no-save-optim"]
    if MOE_ARGS:  # the plain router of Hugging Face's Mixtral: softmax over the top-2 logits, every token to
        # its top-2 experts (no capacity factor, no token dropping), no pre-softmax, no scaling, no expert bias,
        # no shared experts; SequentialMLP experts (no --moe-grouped-gemm); the aux loss as Megatron-LM's Mixtral
        # recipe (it changes no forward; never computed here: seeded gradients, logits in eval mode)
        sys.argv += ["--num-experts", "4", "--moe-router-topk", "2", "--moe-router-score-function", "softmax",
                     "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
                     "--moe-token-dispatcher-type", "allgather", "--expert-model-parallel-size", str(EP),
                     "--no-rope-fusion"]  # rotary's fused kernel needs Transformer Engine ("apply_rope_fusion is not available")
    elif CASE.startswith("moe"):
        sys.argv += ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0",
                     "--expert-model-parallel-size", str(EP)]
    if GPT and FFN is not None:
        sys.argv += ["--ffn-hidden-size", str(FFN)]
    if not GPT:
        sys.argv += ["--group-query-attention", "--num-query-groups", str(GROUPS), "--swiglu", "--normalization", "RMSNorm",
                     "--ffn-hidden-size", str(FFN), "--disable-bias-linear", "--position-embedding-type", "rope"]
    from megatron.training.arguments import parse_args
    return gpt_args(parse_args()) if FROM_ARGS else parse_args()


def gpt_args(args):
    """What Megatron-LM's initialize_megatron makes of the parsed args before pretrain_gpt.py builds the model:
    validate_args(args, pretrain_gpt.py's args_defaults), then the tokenizer, which sets padded_vocab_size
    (set_global_variables' _build_tokenizer: Megatron's build_tokenizer). parse_args read WORLD_SIZE and RANK
    (set in worker, as torchrun does). CPU-only: validate_args asks the GPU's architecture
    (get_device_arch_version, for CUDA_DEVICE_MAX_CONNECTIONS' check with TP > 1): answered 9 (Hopper; no
    GPU here) with CUDA_DEVICE_MAX_CONNECTIONS=1 set, as Megatron-LM's launch scripts set it; neither
    changes an arg."""
    validated(args)
    assert args.padded_vocab_size == VOCAB, args.padded_vocab_size
    return args


def validated(args):
    """validate_args(args, pretrain_gpt.py's args_defaults) and the tokenizer (padded_vocab_size), the GPU's
    architecture answered 9 (see gpt_args). Shared with cross_family_check.py."""
    import megatron.training.arguments as arguments
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    asked = arguments.get_device_arch_version
    arguments.get_device_arch_version = lambda: 9
    try:
        arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    finally:
        arguments.get_device_arch_version = asked
    build_tokenizer(args)
    return args


def record_strict_load(module, result):
    """module.load_state_dict records, in result["strict_load_error"], the first strict load that failed (Megatron-LM's
    load_checkpoint retries it non-strict and swallows the failure). Shared by mcore_load_check.py and
    cross_family_check.py."""
    real_load = module.load_state_dict

    def load_state_dict(sd, strict=True):
        try:
            return real_load(sd, strict=strict)
        except Exception as e:
            if strict and result["strict_load_error"] is None:
                result["strict_load_error"] = f"{type(e).__name__}: {e}"
            raise
    module.load_state_dict = load_state_dict


def gpt_model():
    """pretrain_gpt.py's model (gpt_builders.gpt_builder with --transformer-impl local): the TransformerConfig
    is Megatron-LM's own core_transformer_config_from_args of the validated args (gpt_args), the layer spec
    gpt_builders' _get_transformer_layer_spec(use_te=False, config), GPTModel's arguments gpt_builder's."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.training.arguments import core_transformer_config_from_args
    args = megatron_args()
    cfg = core_transformer_config_from_args(args)
    spec = get_gpt_layer_local_spec(cfg.num_moe_experts, cfg.moe_grouped_gemm, cfg.qk_layernorm, cfg.multi_latent_attention,
                                    cfg.experimental_attention_variant, normalization=cfg.normalization,
                                    use_kitchen=cfg.use_kitchen, use_kitchen_attention=cfg.use_kitchen_attention,
                                    kitchen_attention_backend=cfg.kitchen_attention_backend)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                     max_sequence_length=args.max_position_embeddings,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     fp16_lm_cross_entropy=args.fp16_lm_cross_entropy, parallel_output=True,
                     share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                     position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                     rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling)
    return model, cfg, args


def build(seed):
    """The model (and, with the distributed optimizer, Megatron's DDP and get_megatron_optimizer over it)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups, get_megatron_optimizer
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    torch.manual_seed(seed)
    if FROM_ARGS:
        model, cfg, _ = gpt_model()
    else:
        cfg, pos = config()
        spec = get_gpt_layer_local_spec(normalization=cfg.normalization,
                                        **({"num_experts": 4, "moe_grouped_gemm": False} if CASE.startswith("moe") else {}))
        model = GPTModel(config=cfg, transformer_layer_spec=spec,
                         vocab_size=VOCAB, max_sequence_length=32, position_embedding_type=pos,
                         pre_process=parallel_state.is_pipeline_first_stage(),
                         post_process=parallel_state.is_pipeline_last_stage(), share_embeddings_and_output_weights=False)
    ocfg = OptimizerConfig(optimizer="adam", lr=1e-3, min_lr=1e-5, weight_decay=0.01, adam_beta2=0.95, clip_grad=0.0,
                           use_distributed_optimizer=DISTOPT, bf16=BF16,
                           params_dtype=torch.bfloat16 if BF16 else torch.float32)
    if DISTOPT or FLOAT16 or MEGATRON_OPT:  # as Megatron-LM builds it: DDP with its grad buffers, then get_megatron_optimizer
        if BF16:
            model = model.to(torch.bfloat16)
        ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
            use_distributed_optimizer=DISTOPT, grad_reduce_in_fp32=BF16,
            overlap_grad_reduce=BUCKET is not None or OVERLAP, bucket_size=BUCKET), model)
        opt = get_megatron_optimizer(ocfg, [ddp])
        # FLOAT16: the torch Adam inside Float16OptimizerWithFloat16Params (its state is keyed by the fp32 main params)
        return model, ddp, opt, (distributed_optimizers(opt)[0].optimizer if FLOAT16 else None)
    groups = _get_param_groups([model], ocfg, None)  # Megatron's own: no weight decay on biases and 1-D tensors
    adam = torch.optim.Adam(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    real_tensor = torch.tensor
    torch.tensor = lambda *a, **k: real_tensor(*a, **{**k, "device": "cpu"} if k.get("device") == "cuda" else k)
    opt = FP32Optimizer(adam, ocfg, lambda o, c: None)
    torch.tensor = real_tensor
    return model, None, opt, adam


def distributed_optimizers(opt):
    """get_megatron_optimizer's ChainedOptimizer holds one DistributedOptimizer per kind of parameter
    (one here: dense; experts would get a second)."""
    return getattr(opt, "chained_optimizers", [opt])


def layout(model, ddp, chained):
    """Megatron's own layout of the distributed optimizer on this rank: per_bucket_numel(_unpadded), each
    buffer's param_index_map under DDP's parameter names, and the part of each bucket this DP rank owns."""
    from megatron.core import parallel_state as ps
    param_to_name = {p: n for n, p in ddp.module.named_parameters() if p.requires_grad}  # as DDP builds it
    sharded = {}
    for sh in model.sharded_state_dict().values():
        if hasattr(sh, "data"):
            sharded[id(sh.data)] = sh
    key = lambda d: ",".join(str(t).replace("torch.", "") for t in d)
    return {"rank": dist.get_rank(), "ddp_overlap_grad_reduce": ddp.ddp_config.overlap_grad_reduce,
            "ddp_bucket_size": ddp.bucket_size, "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(), "dp_rank": ps.get_data_parallel_rank(),
            "ep_rank": ps.get_expert_model_parallel_rank(), "expert_dp_rank": ps.get_expert_data_parallel_rank(),
            "optimizers": [one_layout(opt, param_to_name, sharded, key) for opt in distributed_optimizers(chained)]}


def one_layout(opt, param_to_name, sharded, key):
    gbufs = []
    for gbuf_idx, buffer in enumerate(opt.buffers):
        (dtype, ranges), = opt.gbuf_ranges[gbuf_idx].items()
        params = []
        for p, (start, end, bucket_id) in buffer.param_index_map.items():
            sh = sharded.get(id(p))  # the model's ShardedTensor (or ShardedTensorFactory) of this parameter
            params.append({"name": param_to_name[p], "shape": list(p.shape), "start": start, "end": end,
                           "bucket_id": bucket_id, "key": sh.key if sh else None,
                           "global_shape": list(sh.global_shape) if hasattr(sh, "global_shape") else None,
                           "global_offset": list(sh.global_offset) if hasattr(sh, "global_offset") else None})
        buckets = []
        for b, bucket in enumerate(buffer.buckets):
            owned = [{"name": param_to_name[p], "gbuf_world": [r["gbuf_world"].start, r["gbuf_world"].end],
                      "gbuf_local": [r["gbuf_local"].start, r["gbuf_local"].end],
                      "param": [r["param"].start, r["param"].end]}
                     for p, r in ranges[b]["param_map"].items()]
            buckets.append({"bucket_id": b, "offset": bucket.offset, "numel": bucket.grad_data.numel(),
                            "numel_unpadded": bucket.numel_unpadded, "params": len(bucket.params_list),
                            "owned_by_this_dp_rank": owned})
        gbufs.append({"gbuf_idx": gbuf_idx, "dtype": key(dtype), "numel": buffer.numel,
                      "numel_unpadded": buffer.numel_unpadded,
                      "per_bucket_numel": opt.per_bucket_numel[gbuf_idx][dtype],
                      "per_bucket_numel_unpadded": opt.per_bucket_numel_unpadded[gbuf_idx][dtype],
                      "buckets": buckets, "param_index_map": params})
    return {"dp_group_idx": opt.data_parallel_group_idx, "dp_size": opt.data_parallel_group.size(),
            "dp_group_rank": opt.data_parallel_group.rank(),
            "distributed_optimizer_instance_id": opt.distributed_optimizer_instance_id, "gbufs": gbufs}


def step_kept_apart():
    """For loading only, a CPU-only workaround: without Transformer Engine or Apex the distributed optimizer
    runs torch's Adam, which keeps a per-parameter 'step' tensor (FusedAdam does not). Megatron's
    _set_main_param_and_optimizer_states then wants a 'step' from every loaded form (KeyError: 'step' for
    fully_reshardable and the legacy distrib_optim.pt; dp_reshardable carries the step it was made with).
    Megatron restores the step from the param groups (load_state_dict): here the per-parameter 'step' is
    left out of that copy, as it would be with FusedAdam. And the copy runs under torch.no_grad(): with fp32
    parameters the main param is a view of the model parameter, and load_parameter_state_from_dp_reshardable
    lacks the @torch.no_grad() its fully_reshardable twin has ("a view of a leaf Variable that requires grad
    is being used in an in-place operation")."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    original = DistributedOptimizer._set_main_param_and_optimizer_states

    def without_step(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        step = state.pop("step", None)
        try:
            with torch.no_grad():
                original(self, model_param, {k: v for k, v in tensors.items() if k != "step"})
        finally:
            if step is not None:
                state["step"] = step
    DistributedOptimizer._set_main_param_and_optimizer_states = without_step


def trained_boxes(model, chained):
    """The optimizer's fp32 state (main param, exp_avg, exp_avg_sq) as boxes of its checkpoint tensors:
    each DP rank's shards (the ranges of the flattened parameters it owns, Megatron's gbuf_ranges) gathered
    over the DP group into whole local parameters, then placed as the model's ShardedTensor (or its
    ShardedTensorFactory's, SwiGLU's linear_fc1) places the parameter: key, global shape, global offset."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    names = {p: n for n, p in model.named_parameters()}
    owned = {False: [], True: []}  # by whether the parameter is an expert's (expert-parallel: its shards over the expert DP group)
    for opt in distributed_optimizers(chained):
        for ranges in opt.gbuf_ranges:
            for buckets in ranges.values():
                for bucket in buckets:
                    for p, r in bucket["param_map"].items():
                        for k, v in opt._get_main_param_and_optimizer_states(p).items():
                            if k != "step":
                                owned[not getattr(p, "allreduce", True)].append((names[p], k, r["param"].start, r["param"].end, v.detach().clone()))
    every = []
    for expert, group in ((False, parallel_state.get_data_parallel_group()), (True, parallel_state.get_expert_data_parallel_group())):
        got = [None] * group.size()
        dist.all_gather_object(got, owned[expert], group=group)
        every += got
    whole = {}
    for name, k, start, end, v in (x for o in every for x in o):
        shape = dict(model.named_parameters())[name].shape
        whole.setdefault((name, k), torch.zeros(shape.numel(), dtype=v.dtype))[start:end] = v
    boxes = []
    for sh in model.sharded_state_dict().values():
        if not hasattr(sh, "data") or (names.get(sh.data), "param") not in whole:
            continue
        for k in ("param", "exp_avg", "exp_avg_sq"):
            data = whole[(names[sh.data], k)].view(sh.data.shape)
            built = [sh] if isinstance(sh, ShardedTensor) else list(nested_values(sh.build_fn(sh.key, data, sh.replica_id, None)))
            for st in built:
                box = data if st is sh else st.data
                boxes.append((f"optimizer.state.{k}.{st.key}", tuple(st.global_shape), tuple(st.global_offset),
                              (1,) * st.prepend_axis_num + tuple(box.shape), box.contiguous().clone()))
    return boxes


def assemble(all_boxes):
    """The global tensors of the boxes every rank gathered (replicas write the same values again)."""
    out = {}
    for key, gshape, goffset, shape, v in all_boxes:
        t = out.setdefault(key, torch.zeros(gshape, dtype=v.dtype))
        t[tuple(slice(o, o + n) for o, n in zip(goffset, shape))] = v.view(shape)
    return out


def optimizer_state(model, chained):
    """Every tensor this rank holds: the model's parameters and, for each parameter's shard this DP rank
    owns, the optimizer's main param, exp_avg, exp_avg_sq and step (Megatron's own accessor), by name."""
    names = {p: n for n, p in model.named_parameters()}
    out = {"model." + n: p.detach().clone() for n, p in model.named_parameters()}
    steps = set()
    for opt in distributed_optimizers(chained):
        for ranges in opt.gbuf_ranges:
            for buckets in ranges.values():
                for bucket in buckets:
                    for p in bucket["param_map"]:
                        for k, v in opt._get_main_param_and_optimizer_states(p).items():
                            out[f"{k}.{names[p]}"] = v.detach().clone()
        steps |= {g["step"] for g in opt.state_dict()["optimizer"]["param_groups"]}
    return out, sorted(steps)


class Scheduler:
    """The schedule the torch_dist copies save (opt_param_scheduler), for save_checkpoint to ask for."""
    def state_dict(self):
        return {"max_lr": 1e-3, "min_lr": 1e-5, "num_steps": STEPS * 2}


def save_legacy(model_chunk, opt):
    """Megatron-LM's own save_checkpoint with --ckpt-format torch: get_rng_state, get_checkpoint_name,
    the distributed optimizer's save_parameter_state into get_distributed_optimizer_checkpoint_name's
    distrib_optim.pt, generate_state_dict (state_dict_for_save_checkpoint, optimizer.state_dict(), the
    scheduler, the RNG states), torch.save on DP rank 0, latest_checkpointed_iteration.txt. Its global
    args: parse_args with --ckpt-format torch --save LEGACY_DIR and Megatron-LM's update_use_dist_ckpt
    (the part of validate_args it reads). CPU-only: torch.cuda.get_rng_state gives 16 zero bytes (the
    size of a CUDA generator's state; there is none)."""
    from megatron.training import global_vars
    from megatron.training.checkpointing import save_checkpoint
    from megatron.training.utils import update_use_dist_ckpt
    args = megatron_args(legacy=True)
    update_use_dist_ckpt(args)
    global_vars.set_args(args)
    torch.cuda.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    save_checkpoint(STEPS, [model_chunk], opt, Scheduler(), 0)
    print(f"[{dist.get_rank()}] SAVE OK legacy (--ckpt-format torch, Megatron-LM's save_checkpoint)", flush=True)


def legacy_file():
    """This rank's model_optim_rng.pt, by Megatron-LM's get_checkpoint_name."""
    from megatron.training.checkpointing import get_checkpoint_name
    return get_checkpoint_name(LEGACY_DIR, STEPS)


def plain_state(model, adam):
    """The model's parameters and torch Adam's state of each, by name (an FP32Optimizer's)."""
    out = {}
    for n, p in model.named_parameters():
        out["model." + n] = p.detach().clone()
        for k, v in adam.state[p].items():
            out[f"{k}.{n}"] = v.detach().clone()
    return out


def mixed_state(model, adam):
    """Float16OptimizerWithFloat16Params' state, by name: each bf16 model parameter, its fp32 main param
    (param.main_param, the copy torch Adam steps) and torch Adam's state of that main param."""
    out = {}
    for n, p in model.named_parameters():
        out["model." + n] = p.detach().clone()
        out["main_param." + n] = p.main_param.detach().clone()
        for k, v in adam.state[p.main_param].items():
            out[f"{k}.{n}"] = v.detach().clone()
    return out


def structure(x, depth=0):
    """A nested value's shape, for train.log: dict keys, list lengths, tensors' shape and dtype."""
    if isinstance(x, torch.Tensor):
        return f"tensor{list(x.shape)} {str(x.dtype).replace('torch.', '')}"
    if isinstance(x, dict):
        items = list(x.items())
        inner = ", ".join(f"{k!r}: {structure(v, depth + 1)}" for k, v in items[:3])
        return "{" + inner + (f", ... ({len(items)} keys)" if len(items) > 3 else "") + "}"
    if isinstance(x, (list, tuple)):
        if x and all(isinstance(v, int) for v in x):
            return f"[{len(x)} ints: {x[0]}..{x[-1]}]"
        inner = ", ".join(structure(v, depth + 1) for v in x[:2])
        return ("[" if isinstance(x, list) else "(") + inner + (f", ... ({len(x)} items)" if len(x) > 2 else "") + ("]" if isinstance(x, list) else ")")
    return repr(x) if isinstance(x, (int, float, bool, str, type(None))) else type(x).__name__


def float16_checks(model, ddp, opt, adam, state):
    """gpt_tp2_pp2_bf16_legacy (Float16OptimizerWithFloat16Params): checkpoint/ as Megatron-LM's save_checkpoint
    would save it (its _build_sharded_state_dict_metadata for sharded_state_dict, its content_metadata), legacy/ by
    Megatron-LM's own save_checkpoint, then each loaded into a fresh model, DDP and optimizer as Megatron-LM's
    load_checkpoint does and compared bitwise with the trained state (model, main params, Adam's state and step)."""
    from megatron.core import parallel_state, dist_checkpointing
    from megatron.training.checkpointing import _build_sharded_state_dict_metadata
    from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
    rank, case_dir = dist.get_rank(), os.path.join(OUT, CASE)
    args = megatron_args()
    metadata = _build_sharded_state_dict_metadata(args)
    dist_checkpointing.save(state(args, metadata), CKPT, content_metadata=_clean_metadata_for_serialization(metadata))
    print(f"[{rank}] SAVE OK checkpoint ({type(distributed_optimizers(opt)[0]).__name__})", flush=True)
    trained = mixed_state(model, adam)
    save_legacy(ddp, opt)
    weights = save_weights_only(ddp, opt)  # checkpoint_weights_only/: save_checkpoint with --no-save-optim
    name = legacy_file()
    sd = torch.load(name, weights_only=False)
    o_sd = sd["optimizer"]
    print(f"[{rank}] legacy optimizer of {os.path.relpath(name, case_dir)}: {structure(o_sd)}", flush=True)
    print(f"[{rank}] legacy optimizer['optimizer']['state']: {len(o_sd['optimizer']['state'])} entries keyed "
          f"{sorted(o_sd['optimizer']['state'])[:3]}..; steps {sorted({v['step'].item() for v in o_sd['optimizer']['state'].values()})}; "
          f"param_groups' params {[g['params'] for g in o_sd['optimizer']['param_groups']]}, their wd_mult "
          f"{[g.get('wd_mult') for g in o_sd['optimizer']['param_groups']]}; fp32_from_fp16_params "
          f"{[len(g) for g in o_sd['fp32_from_fp16_params']]} tensors per group", flush=True)
    # which parameter each (group, position) is: the order of Megatron's param groups (float16_groups)
    names = {p: n for n, p in model.named_parameters()}
    order = [[names[p] for p in group] for group in distributed_optimizers(opt)[0].float16_groups]
    print(f"[{rank}] param groups' order (float16_groups, by name): {order}", flush=True)
    print(f"[{rank}] args saved (legacy): bf16={sd['args'].bf16} params_dtype={sd['args'].params_dtype} "
          f"use_distributed_optimizer={sd['args'].use_distributed_optimizer} accumulate_allreduce_grads_in_fp32="
          f"{sd['args'].accumulate_allreduce_grads_in_fp32} data_parallel_size={sd['args'].data_parallel_size} "
          f"tensor_model_parallel_size={sd['args'].tensor_model_parallel_size} pipeline_model_parallel_size="
          f"{sd['args'].pipeline_model_parallel_size} ckpt_format={sd['args'].ckpt_format}", flush=True)
    results = []
    # checkpoint/ (torch_dist), as Megatron-LM's load_checkpoint: the content_metadata, sharded_state_dict, load_state_dict
    m, d, o, a = build(4321)
    meta = dist_checkpointing.load_content_metadata(CKPT)
    meta["dp_cp_group"] = parallel_state.get_data_parallel_group(with_context_parallel=True)
    model_sd = m.sharded_state_dict(metadata=meta)
    got = dist_checkpointing.load({"model": model_sd, "optimizer": o.sharded_state_dict(model_sd, is_loading=True, metadata=meta)}, CKPT)
    d.load_state_dict(got["model"], strict=True)
    o.load_state_dict(got["optimizer"])
    # legacy/ (--ckpt-format torch)
    m2, d2, o2, a2 = build(4321)
    d2.load_state_dict(sd["model"], strict=True)
    o2.load_state_dict(sd["optimizer"])
    for label, mm, aa, what in (("LOAD CHECK", m, a, "checkpoint/ (dist_checkpointing.load, model.load_state_dict, "
                                 "optimizer.load_state_dict)"),
                                ("LEGACY LOAD CHECK", m2, a2, f"{os.path.relpath(name, case_dir)} (model.load_state_dict, "
                                 "optimizer.load_state_dict)")):
        now = mixed_state(mm, aa)
        bad = sorted(k for k in trained if k not in now or now[k].dtype != trained[k].dtype or not torch.equal(trained[k], now[k]))
        kinds = ", ".join(f"{sum(k.startswith(kind + '.') for k in trained)} {kind}"
                          for kind in ("model", "main_param", "exp_avg", "exp_avg_sq", "step"))
        results.append(not bad and sorted(now) == sorted(trained))
        print(f"[{rank}] {label} {'OK' if results[-1] else 'DIFFERS'}: {what} loaded into a fresh model, DDP and "
              f"Float16OptimizerWithFloat16Params: {len(trained)} tensors ({kinds}) "
              + ("bitwise equal to the trained ones (and dtypes)" if not bad else f"{len(bad)} differ: {bad[:6]}"), flush=True)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, results)
    if rank == 0:
        print(f"[0] LOAD CHECK / LEGACY LOAD CHECK on all {len(every)} ranks: "
              + ("bitwise equal" if all(all(r) for r in every) else f"NOT EQUAL {every}"), flush=True)
    weights_only_check(weights)


def save_weights_only(model_chunk, opt):
    """gpt_tp2_pp2_bf16_legacy's checkpoint_weights_only/: Megatron-LM's own save_checkpoint with --ckpt-format
    torch_dist --no-save-optim (generate_state_dict leaves out optimizer and opt_param_scheduler, though both are
    passed, as in a real run): the model's sharded_state_dict with _build_sharded_state_dict_metadata's metadata,
    args, checkpoint_version, iteration, num_floating_point_operations_so_far and get_rng_state's ShardedObject,
    through dist_checkpointing.save (TorchDistSaveShardedStrategy, content_metadata) into WEIGHTS_SAVE/iter_0000003,
    which is then renamed checkpoint_weights_only/ (the tracker file, latest_checkpointed_iteration.txt, is left
    out). Its global args: the validated args of the same flags with --ckpt-format torch_dist --save WEIGHTS_SAVE
    --save-interval STEPS --no-save-optim, and update_use_dist_ckpt (use_dist_ckpt True). CPU-only: as save_legacy,
    torch.cuda.get_rng_state gives 16 zero bytes. Returns the trained model's tensors (its state_dict), by name."""
    import shutil
    from megatron.training import global_vars
    from megatron.training.checkpointing import save_checkpoint, get_checkpoint_name
    from megatron.training.utils import update_use_dist_ckpt
    rank = dist.get_rank()
    trained = {k: v.detach().clone() for k, v in model_chunk.module.state_dict().items() if isinstance(v, torch.Tensor)}
    args = megatron_args(weights_only=True)
    update_use_dist_ckpt(args)
    assert args.no_save_optim is True and args.ckpt_format == "torch_dist" and args.use_dist_ckpt, args
    global_vars.set_args(args)
    torch.cuda.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    save_checkpoint(STEPS, [model_chunk], opt, Scheduler(), 0)
    folder = get_checkpoint_name(WEIGHTS_SAVE, STEPS, return_base_dir=True)
    if rank == 0:
        with open(os.path.join(WEIGHTS_SAVE, "latest_checkpointed_iteration.txt")) as f:
            tracker = f.read()
        print(f"[0] SAVE OK weights only (--ckpt-format torch_dist --no-save-optim, Megatron-LM's save_checkpoint): "
              f"{os.path.relpath(folder, os.path.join(OUT, CASE))} {sorted(os.listdir(folder))}, "
              f"latest_checkpointed_iteration.txt {tracker!r}; renamed {os.path.basename(CKPT_WEIGHTS)}/", flush=True)
        if os.path.exists(CKPT_WEIGHTS):
            shutil.rmtree(CKPT_WEIGHTS)
        os.rename(folder, CKPT_WEIGHTS)
        shutil.rmtree(WEIGHTS_SAVE)
    dist.barrier()
    return trained


def weights_only_check(trained):
    """checkpoint_weights_only/ read back as Megatron-LM's load_checkpoint reads a torch_dist checkpoint without
    optimizer: its content_metadata for the fresh model's sharded_state_dict, the RNG state's ShardedObject as
    get_rng_state makes it, dist_checkpointing.load with StrictHandling.RAISE_ALL (any key of the checkpoint not
    asked for, or asked for and missing, raises), DDP's load_state_dict(strict=True); every tensor of the model's
    state_dict compared bitwise (and by dtype) with the trained one. Rank 0 also lists .metadata's keys and
    common.pt's."""
    from megatron.core import parallel_state, dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject
    from megatron.core.dist_checkpointing.validation import StrictHandling
    rank = dist.get_rank()
    m, d, o, a = build(4321)
    meta = dist_checkpointing.load_content_metadata(CKPT_WEIGHTS)
    meta["dp_cp_group"] = parallel_state.get_data_parallel_group(with_context_parallel=True)
    model_sd = m.sharded_state_dict(metadata=meta)
    rng = ShardedObject("rng_state", None, (PP, TP), (parallel_state.get_pipeline_model_parallel_rank(),
                        parallel_state.get_tensor_model_parallel_rank()),
                        replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))
    got = dist_checkpointing.load({"model": model_sd, "rng_state": rng}, CKPT_WEIGHTS, strict=StrictHandling.RAISE_ALL)
    d.load_state_dict(got["model"], strict=True)
    now = {k: v for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}
    bad = sorted(k for k in trained if k not in now or now[k].dtype != trained[k].dtype or not torch.equal(now[k], trained[k]))
    ok = not bad and sorted(now) == sorted(trained)
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in now.values()})
    print(f"[{rank}] WEIGHTS-ONLY LOAD CHECK {'OK' if ok else 'DIFFERS'}: {os.path.basename(CKPT_WEIGHTS)}/ "
          f"(dist_checkpointing.load strict=RAISE_ALL of model + rng_state, DDP load_state_dict(strict=True)) loaded into "
          f"a fresh model: {len(trained)} tensors ({', '.join(dtypes)}) "
          + ("bitwise equal to the trained ones (and dtypes)" if not bad else f"{len(bad)} differ: {bad[:6]}")
          + f"; common state loaded: {sorted(k for k in got if k not in ('model', 'rng_state'))}; rng_state "
          f"{type(got['rng_state']).__name__} of {len(got['rng_state'])}", flush=True)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, ok)
    if rank == 0:
        import torch.distributed.checkpoint as dcp
        md = dcp.FileSystemReader(CKPT_WEIGHTS).read_metadata()
        keys = sorted(md.state_dict_metadata)
        common = torch.load(os.path.join(CKPT_WEIGHTS, "common.pt"), weights_only=False)
        print(f"[0] WEIGHTS-ONLY LOAD CHECK on all {len(every)} ranks: " + ("bitwise equal" if all(every) else f"NOT EQUAL {every}"), flush=True)
        print(f"[0] {os.path.basename(CKPT_WEIGHTS)}/: {sorted(os.listdir(CKPT_WEIGHTS))}; .metadata: {len(keys)} keys, "
              f"{sum(k.startswith('optimizer') for k in keys)} optimizer.*: {keys}", flush=True)
        print(f"[0] {os.path.basename(CKPT_WEIGHTS)}/common.pt: {structure(common)}; args: ckpt_format={common['args'].ckpt_format} "
              f"no_save_optim={common['args'].no_save_optim} use_dist_ckpt={common['args'].use_dist_ckpt} save={common['args'].save}", flush=True)


def saved_bucket_args(ddp):
    """gpt_dp2_buckets_legacy: the bucket fields of the args as saved in common.pt (both forms) and in the legacy
    model_optim_rng.pt, against DDP's own bucket_size and the buffers' buckets."""
    dist.barrier()
    rank = dist.get_rank()
    used = ddp.bucket_size
    sizes = [[b.numel_unpadded for b in buf.buckets] for buf in ddp.buffers]
    print(f"[{rank}] DDP: overlap_grad_reduce={ddp.ddp_config.overlap_grad_reduce} bucket_size={used} "
          f"(ddp_config.bucket_size={ddp.ddp_config.bucket_size}); buckets' numel_unpadded {sizes}, numel "
          f"{[[b.grad_data.numel() for b in buf.buckets] for buf in ddp.buffers]}", flush=True)
    for where in (os.path.join(CKPT, "common.pt"), os.path.join(CKPT_DP, "common.pt"), legacy_file()):
        args = torch.load(where, weights_only=False)["args"]
        ok = args.overlap_grad_reduce is True and args.ddp_bucket_size == used and args.data_parallel_size == DP
        print(f"[{rank}] args saved in {os.path.relpath(where, os.path.join(OUT, CASE))}: overlap_grad_reduce="
              f"{args.overlap_grad_reduce} ddp_bucket_size={args.ddp_bucket_size} ddp_num_buckets={args.ddp_num_buckets} "
              f"data_parallel_size={args.data_parallel_size} use_distributed_optimizer={args.use_distributed_optimizer} "
              f"world_size={args.world_size} ckpt_format={args.ckpt_format}: "
              + ("as DDP used" if ok else "NOT WHAT DDP USED"), flush=True)
        assert ok, where


def describe(model, args):
    """train.log: what the built model computes (its config and GPTModel's attributes) and what its args say,
    and the activation its MLP applied, measured: layer 0's linear_fc2 input against Megatron's tanh
    approximation (fused_bias_gelu's bias_gelu) and against exact GeLU of linear_fc1's output + bias."""
    cfg, rank, fn = model.config, dist.get_rank(), model.config.activation_func
    print(f"[{rank}] config (core_transformer_config_from_args): bias_activation_fusion={cfg.bias_activation_fusion} "
          f"activation_func={'torch.nn.functional.gelu' if fn is F.gelu else fn.__qualname__} gated_linear_unit={cfg.gated_linear_unit} "
          f"add_bias_linear={cfg.add_bias_linear} normalization={cfg.normalization} layernorm_epsilon={cfg.layernorm_epsilon} "
          f"hidden {cfg.hidden_size} ffn {cfg.ffn_hidden_size} heads {cfg.num_attention_heads} "
          f"query groups {cfg.num_query_groups}; GPTModel: share_embeddings_and_output_weights="
          f"{model.share_embeddings_and_output_weights} position_embedding_type={model.position_embedding_type} "
          f"vocab_size={model.vocab_size}", flush=True)
    print(f"[{rank}] args: " + " ".join(f"{k}={getattr(args, k)!r}" for k in (
        "bias_gelu_fusion", "openai_gelu", "swiglu", "add_bias_linear", "untie_embeddings_and_output_weights",
        "position_embedding_type", "normalization", "layernorm_epsilon", "padded_vocab_size", "transformer_impl")), flush=True)
    mlp, seen = model.decoder.layers[0].mlp, []
    hook = mlp.linear_fc2.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    x = torch.randn(16, 2, cfg.hidden_size, generator=torch.Generator().manual_seed(5)).to(mlp.linear_fc1.weight.dtype)
    with torch.no_grad():
        h, b = mlp.linear_fc1(x)
        mlp(x)
    hook.remove()
    y, seen = (h + b).float(), [seen[0].float()]  # bf16 (FLOAT16): measured in fp32
    tanh = y * 0.5 * (1.0 + torch.tanh(0.79788456 * y * (1 + 0.044715 * y * y)))
    d_tanh, d_exact = (seen[0] - tanh).abs().max().item(), (seen[0] - F.gelu(y)).abs().max().item()
    computed = "tanh-approximation GeLU" if d_tanh < d_exact else "exact GeLU"
    print(f"[{rank}] activation computed: {computed} (layer 0's linear_fc2 input vs linear_fc1's output + bias: "
          f"max diff {d_tanh:.1e} from Megatron's tanh approximation, {d_exact:.1e} from exact GeLU)", flush=True)
    return computed


MOE_FIELDS = ("num_moe_experts", "moe_router_topk", "moe_router_score_function", "moe_router_pre_softmax",
              "moe_router_topk_scaling_factor", "moe_router_load_balancing_type", "moe_aux_loss_coeff",
              "moe_token_dispatcher_type", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
              "moe_token_drop_policy", "moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk",
              "moe_router_dtype", "moe_shared_expert_intermediate_size", "moe_ffn_hidden_size", "moe_grouped_gemm",
              "moe_input_jitter_eps", "moe_z_loss_coeff", "moe_router_bias_update_rate", "expert_model_parallel_size",
              "expert_tensor_parallel_size", "tensor_model_parallel_size", "sequence_parallel", "gated_linear_unit",
              "add_bias_linear", "normalization", "layernorm_epsilon", "rotary_interleaved", "hidden_size", "ffn_hidden_size",
              "num_attention_heads", "num_query_groups", "kv_channels", "num_layers", "bias_activation_fusion",
              "init_method_std")


def moe_settings(model):
    """moe_tp2_ep2_logits: the built model's config (core_transformer_config_from_args) as megatron_logits.json records it."""
    cfg = model.config
    out = {k: getattr(cfg, k) for k in MOE_FIELDS}
    out["activation_func"] = cfg.activation_func.__qualname__
    out.update(vocab_size=model.vocab_size, max_sequence_length=model.max_sequence_length, rotary_base=model.rotary_base,
               rotary_percent=model.rotary_percent,
               position_embedding_type=model.position_embedding_type,
               share_embeddings_and_output_weights=model.share_embeddings_and_output_weights,
               experts_class=type(model.decoder.layers[0].mlp.experts).__name__,
               token_dispatcher_class=type(model.decoder.layers[0].mlp.token_dispatcher).__name__)
    return json.loads(json.dumps(out, default=str))


def describe_moe(model, args):
    """train.log for moe_tp2_ep2_logits: the config the model was built from and the args saved, as to the router."""
    rank = dist.get_rank()
    print(f"[{rank}] config (core_transformer_config_from_args): " + " ".join(f"{k}={v!r}" for k, v in moe_settings(model).items()), flush=True)
    print(f"[{rank}] args: " + " ".join(f"{k}={getattr(args, k, None)!r}" for k in (
        "num_experts", "moe_router_topk", "moe_router_score_function", "moe_router_pre_softmax", "moe_router_topk_scaling_factor",
        "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_token_dispatcher_type", "moe_expert_capacity_factor",
        "moe_router_enable_expert_bias", "moe_shared_expert_intermediate_size", "moe_ffn_hidden_size", "moe_grouped_gemm",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel", "swiglu", "padded_vocab_size",
        "untie_embeddings_and_output_weights", "rotary_base", "norm_epsilon", "transformer_impl")), flush=True)
    from megatron.core import parallel_state as ps
    print(f"[{rank}] ranks: tp {ps.get_tensor_model_parallel_rank()} dp {ps.get_data_parallel_rank()} ep "
          f"{ps.get_expert_model_parallel_rank()} expert tp {ps.get_expert_tensor_parallel_rank()} expert dp "
          f"{ps.get_expert_data_parallel_rank()}; local experts {model.decoder.layers[0].mlp.local_expert_indices}", flush=True)


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", USE_LIBUV="0")
    if FROM_ARGS:  # parse_args reads the world as torchrun gives it; validate_args wants CUDA_DEVICE_MAX_CONNECTIONS=1 at TP > 1
        os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
        # Megatron's jit_fuser is torch.compile, which needs a C++ compiler on CPU (the chroot has none): the
        # fused bias-GeLU and bias-dropout-add run eagerly, the same functions unfused.
        import torch._dynamo as dynamo
        dynamo.config.disable = True
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    if DISTOPT or FLOAT16 or MEGATRON_OPT:  # FLOAT16: Float16OptimizerWithFloat16Params accepts only torch.cuda.*Tensor parameters
        cuda_to_cpu()
    try:
        from megatron.core import parallel_state, dist_checkpointing, tensor_parallel
        from megatron.core.dist_checkpointing import ShardedObject
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP,
                                                 expert_model_parallel_size=EP)
        torch.manual_seed(1234)
        try:
            tensor_parallel.model_parallel_cuda_manual_seed(123)
        except Exception as e:
            print(f"[{rank}] model_parallel_cuda_manual_seed: {type(e).__name__}", flush=True)
        tracker = tensor_parallel.get_cuda_rng_tracker()  # its CUDA generator cannot be made on CPU; dropout is 0
        tracker.fork = lambda *a, **k: contextlib.nullcontext()
        model, ddp, opt, adam = build(1234)
        computed = describe(model, megatron_args()) if GPT else None
        forward = ddp if ddp is not None else model
        dp_rank = parallel_state.get_data_parallel_rank()
        pp_rank, tp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
        g = torch.Generator().manual_seed(7 + (dp_rank + 10 * pp_rank if DISTOPT else 0))
        # FLOAT16 (TP=2): the TP-sharded parameters' seeded gradients differ per TP rank (their shards would
        # otherwise stay equal: zero-initialised biases); the replicated ones (LayerNorm, row-parallel biases,
        # position embeddings) take g, the same on both TP ranks, and stay equal
        g_tp = torch.Generator().manual_seed(1007 + 100 * tp_rank) if FLOAT16 or MOE_ARGS or (DISTOPT and CASE.startswith("moe")) else g
        # MOE_ARGS: the experts' seeded gradients from one generator per expert shard (EP rank, expert TP rank)
        g_ex = torch.Generator().manual_seed(2007 + 100 * parallel_state.get_expert_model_parallel_rank()
                                             + parallel_state.get_expert_tensor_parallel_rank()) if MOE_ARGS else None
        if MOE_ARGS:
            describe_moe(model, megatron_args())
        for step in range(STEPS):
            tokens = torch.randint(0, VOCAB, (2, 16), generator=g)
            labels = torch.randint(0, VOCAB, (2, 16), generator=g)
            opt.zero_grad()
            if ddp is not None:
                ddp.zero_grad_buffer()
            if MOE_ARGS:  # Megatron-Core refuses to train its MoE layer at TP > 1 without sequence parallelism
                # ("During training, performance may degrade if MoE and tensor parallelism are enabled without also
                # enabling sequence parallelism", MoELayer.forward), which the local spec's torch RMSNorm refuses
                # (WrappedTorchNorm: "sequence parallel not supported by torch LayerNorm"): seeded gradients, the
                # same for a parameter's replicas (dense TP-replicated: g on every rank; dense TP-sharded: per TP
                # rank, the same on both DP replicas; experts: per expert shard, which one rank holds), so that
                # every replica stays bitwise equal as after DDP's all-reduce
                for p in model.parameters():
                    gen = g_ex if not getattr(p, "allreduce", True) else g_tp if getattr(p, "tensor_model_parallel", False) else g
                    p.grad = torch.randn(p.shape, generator=gen) * 1e-2
                loss = torch.tensor(0.0)
            elif not SEEDED:
                pos_ids = torch.arange(16).unsqueeze(0).expand(2, 16)
                mask = torch.triu(torch.ones(1, 1, 16, 16), diagonal=1).bool()  # causal, given: the default is made on cuda
                loss = forward(tokens, pos_ids, mask, labels=labels).float().mean()
                loss.backward()
                if DISTOPT or MEGATRON_OPT:
                    ddp.finish_grad_sync()
            else:  # no pipeline schedule on CPU here: every parameter gets a seeded gradient
                for p in model.parameters():
                    if ddp is not None:  # into DDP's grad buffer (what its backward hook does), reduce-scattered
                        # (all-reduced without the distributed optimizer) by finish_grad_sync
                        p.main_grad.copy_(torch.randn(p.shape, generator=g_tp if getattr(p, "tensor_model_parallel", False) else g) * 1e-2)
                    else:
                        p.grad = torch.randn(p.shape, generator=g) * 1e-2
                if ddp is not None:
                    ddp.finish_grad_sync()
                loss = torch.tensor(0.0)
            if ddp is not None:  # the distributed optimizer, or Float16OptimizerWithFloat16Params (FLOAT16)
                opt.step()
            else:
                adam.step()
            print(f"[{rank}] step {step + 1} loss {loss.item():.6f}" + (" (seeded gradients, no loss)" if (SEEDED and ddp is not None) or MOE_ARGS else ""), flush=True)
        if (PP == 1 and not DISTOPT and not LEGACY) or MOE_ARGS:  # the training model's own logits on a fixed batch: what a Hugging Face export must give
            model.eval()
            ids = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % (VOCAB if MOE_ARGS or MEGATRON_OPT else 128)
            mask = torch.triu(torch.ones(1, 1, 16, 16), diagonal=1).bool()
            with torch.no_grad():
                local = model(ids, torch.arange(16).unsqueeze(0).expand(2, 16), mask).float()  # [b, s, vocab / TP]
            parts = [torch.empty_like(local) for _ in range(TP)]
            dist.all_gather(parts, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
            if GPT:  # how far exact GeLU would be: the same model with its MLP's unfused path (F.gelu, exact)
                model.config.bias_activation_fusion = False
                with torch.no_grad():
                    other = model(ids, torch.arange(16).unsqueeze(0).expand(2, 16), mask).float()
                model.config.bias_activation_fusion = True
                others = [torch.empty_like(other) for _ in range(TP)]
                dist.all_gather(others, other.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
                apart = (torch.cat(others, dim=-1) - torch.cat(parts, dim=-1)).abs().max().item()
                print(f"[{rank}] logits on the fixed batch: the same model computing exact GeLU instead would give "
                      f"logits up to {apart:.2e} apart (max |logit| {torch.cat(parts, dim=-1).abs().max().item():.3f})", flush=True)
            if rank == 0:
                with open(os.path.join(OUT, CASE, "megatron_logits.json"), "w") as f:
                    said = {"activation": computed, "bias_activation_fusion": model.config.bias_activation_fusion,
                            "share_embeddings_and_output_weights": model.share_embeddings_and_output_weights,
                            "exact_gelu_max_abs_diff": apart} if GPT else moe_settings(model) if MOE_ARGS else {}
                    json.dump({"case": CASE, "torch": torch.__version__, "reader": "Megatron-Core 0.17.1 GPTModel",
                               **said, "ids": ids.tolist(), "logits": torch.cat(parts, dim=-1).tolist()}, f)
            model.train()
        import random, numpy
        # What Megatron-LM's generate_state_dict saves besides: its parsed args, the schedule, and the
        # RNG states as a ShardedObject per (pp, tp) rank (here without CUDA's).
        rng = [{"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
                "torch_rng_state": torch.get_rng_state()}]

        def state(args, metadata):
            """generate_state_dict's torch_dist state dict, the optimizer's sharded_state_dict made anew."""
            model_sd = model.sharded_state_dict(**({"metadata": metadata} if BOTH or FLOAT16 or MEGATRON_OPT else {}))
            return {"args": args, "checkpoint_version": 3.0, "iteration": STEPS, "model": model_sd,
                    "optimizer": opt.sharded_state_dict(model_sd, **({"metadata": metadata} if DISTOPT or FLOAT16 or MEGATRON_OPT else {})),
                    "opt_param_scheduler": {"max_lr": 1e-3, "min_lr": 1e-5, "num_steps": STEPS * 2},
                    "rng_state": ShardedObject("rng_state", rng, (PP, TP), (pp_rank, tp_rank),
                                               replica_id=parallel_state.get_data_parallel_rank()),
                    "num_floating_point_operations_so_far": 0}

        if FLOAT16:  # as Megatron-LM's save_checkpoint: its metadata for sharded_state_dict, its content_metadata
            float16_checks(model, ddp, opt, adam, state)
            return
        if MEGATRON_OPT and not DISTOPT:  # as Megatron-LM's save_checkpoint: its metadata for sharded_state_dict, its content_metadata
            from megatron.training.checkpointing import _build_sharded_state_dict_metadata
            from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
            args = megatron_args()
            metadata = _build_sharded_state_dict_metadata(args)
            dist_checkpointing.save(state(args, metadata), CKPT, content_metadata=_clean_metadata_for_serialization(metadata))
            kinds = [type(o).__name__ + "(" + str(len(o.optimizer.param_groups)) + " groups)" for o in distributed_optimizers(opt)]
            print(f"[{rank}] SAVE OK {type(opt).__name__} of {kinds}, metadata {metadata}", flush=True)
            return
        if not BOTH:
            dist_checkpointing.save(state(megatron_args(FORM == "fully_reshardable"),
                                          {"distrib_optim_sharding_type": FORM} if DISTOPT else None), CKPT)
            print(f"[{rank}] SAVE OK", flush=True)
            if LEGACY:  # llama_tp2_legacy: the FP32Optimizer's state
                trained = plain_state(model, adam)
                save_legacy(model, opt)
                m, _, o, a = build(4321)
                name = legacy_file()
                sd = torch.load(name, weights_only=False)
                m.load_state_dict(sd["model"], strict=True)  # as Megatron-LM's load_checkpoint
                o.load_state_dict(sd["optimizer"])
                got = plain_state(m, a)
                bad = sorted(k for k in trained if not torch.equal(trained[k], got[k]))
                print(f"[{rank}] LEGACY LOAD CHECK {'OK' if not bad else 'DIFFERS'}: {os.path.relpath(name, os.path.join(OUT, CASE))} "
                      f"loaded into a fresh model and FP32Optimizer (model.load_state_dict, optimizer.load_state_dict): "
                      f"{len(trained)} tensors (model, exp_avg, exp_avg_sq, step) "
                      + ("bitwise equal to the trained ones" if not bad else f"{len(bad)} differ: {bad[:6]}"), flush=True)
            return
        from megatron.training.checkpointing import _build_sharded_state_dict_metadata
        from megatron.core.dist_checkpointing.utils import _clean_metadata_for_serialization
        if BENCH:  # the benchmark's checkpoint: the dp_reshardable form only, nothing checked or recorded
            args = megatron_args(False)
            metadata = _build_sharded_state_dict_metadata(args)
            dist_checkpointing.save(state(args, metadata), CKPT_DP,
                                    content_metadata=_clean_metadata_for_serialization(metadata))
            print(f"[{rank}] SAVE OK {os.path.basename(CKPT_DP)} ({metadata['distrib_optim_sharding_type']})", flush=True)
            return
        lay = [None] * world
        dist.all_gather_object(lay, layout(model, ddp, opt))
        if rank == 0:
            with open(os.path.join(OUT, CASE, "buckets.json"), "w") as f:
                json.dump({"case": CASE, "megatron": "core_v0.17.1", "ranks": lay}, f, indent=1)
        trained, trained_steps = optimizer_state(model, opt)
        pieces = [None] * world
        dist.all_gather_object(pieces, trained_boxes(model, opt))
        if rank == 0:  # compared with reference.pt once torch has read checkpoint/ (references())
            torch.save(assemble([x for p in pieces for x in p]), os.path.join(OUT, CASE, "trained_state.tmp.pt"))
        # The same state twice, as Megatron-LM's save_checkpoint would save it with and without
        # --dist-ckpt-optim-fully-reshardable: its metadata for sharded_state_dict, its content_metadata.
        for folder, fully in ((CKPT, True), (CKPT_DP, False)):
            args = megatron_args(fully)
            metadata = _build_sharded_state_dict_metadata(args)
            dist_checkpointing.save(state(args, metadata), folder,
                                    content_metadata=_clean_metadata_for_serialization(metadata))
            print(f"[{rank}] SAVE OK {os.path.basename(folder)} ({metadata['distrib_optim_sharding_type']})", flush=True)
        if LEGACY:
            save_legacy(ddp, opt)
        if BUCKETS:  # the args as saved, against the bucket size DDP used (a reader recomputes the buckets from them)
            saved_bucket_args(ddp)
        # The check of the files: each loaded into a fresh model, DDP and optimizer, as Megatron-LM's
        # load_checkpoint does (the sharding type from the checkpoint's content_metadata).
        step_kept_apart()
        loaded = {}
        for folder in (CKPT_DP, CKPT):
            m, d, o, _ = build(4321)
            for one in distributed_optimizers(o):  # Megatron's own (its fsdp_dtensor load's): one step on zero grads
                one._init_optimizer_states_with_dummy_values()
            metadata = dist_checkpointing.load_content_metadata(folder)
            metadata["dp_cp_group"] = parallel_state.get_data_parallel_group(with_context_parallel=True)
            model_sd = m.sharded_state_dict(metadata=metadata)
            sd = {"model": model_sd, "optimizer": o.sharded_state_dict(model_sd, is_loading=True, metadata=metadata)}
            got = dist_checkpointing.load(sd, folder)
            m.load_state_dict(got["model"], strict=True)
            o.load_state_dict(got["optimizer"])
            loaded[os.path.basename(folder)] = optimizer_state(m, o)
        if LEGACY:  # Megatron's own reader of the legacy form (Megatron-LM's load_checkpoint for --ckpt-format torch)
            m, d, o, _ = build(4321)
            for one in distributed_optimizers(o):
                one._init_optimizer_states_with_dummy_values()
            name = legacy_file()
            sd = torch.load(name, weights_only=False)
            m.load_state_dict(sd["model"], strict=True)
            o.load_state_dict(sd["optimizer"])
            o.load_parameter_state(os.path.join(os.path.dirname(name), "distrib_optim.pt"))
            got, got_steps = optimizer_state(m, o)
            bad = sorted(k for k in trained if not torch.equal(trained[k], got[k]))
            print(f"[{rank}] LEGACY LOAD CHECK {'OK' if not bad and got_steps == trained_steps else 'DIFFERS'}: "
                  f"{os.path.relpath(name, os.path.join(OUT, CASE))} (model.load_state_dict, optimizer.load_state_dict) and "
                  f"distrib_optim.pt (optimizer.load_parameter_state) loaded into a fresh model, DDP and optimizer: "
                  f"{len(trained)} tensors, steps {got_steps}: "
                  + ("bitwise equal to the trained ones" if not bad else f"{len(bad)} differ: {bad[:6]}"), flush=True)
        (a, a_steps), (b, b_steps) = loaded["checkpoint_dp_reshardable"], loaded["checkpoint"]
        kinds = lambda keys: ", ".join(f"{sum(k.startswith(kind + '.') for k in keys)} {kind}"
                                       for kind in ("model", "param", "exp_avg", "exp_avg_sq", "step"))
        report = {}
        for label, x, y in (("dp_reshardable vs fully_reshardable", a, b), ("dp_reshardable vs trained", a, trained),
                            ("fully_reshardable vs trained", b, trained)):
            report[label] = sorted(k for k in trained if x[k].dtype != y[k].dtype or not torch.equal(x[k], y[k]))
        same = not any(report.values()) and trained_steps == a_steps == b_steps
        print(f"[{rank}] LOAD CHECK {'OK' if same else 'DIFFERS'}: {len(trained)} tensors ({kinds(trained)}: the model's "
              f"parameters, the optimizer's state of every shard this DP rank owns), param-group steps trained / "
              f"dp_reshardable / fully_reshardable {trained_steps} {a_steps} {b_steps}; "
              + "; ".join(f"{k}: " + ("bitwise equal" if not v else f"{len(v)} differ ({kinds(v)}), e.g. {v[:3]}")
                          for k, v in report.items()), flush=True)
        results = [None] * world
        dist.all_gather_object(results, same)
        if rank == 0:
            print(f"[0] LOAD CHECK on all {world} ranks: {'bitwise equal' if all(results) else 'NOT EQUAL'}", flush=True)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def references():
    """torch's own DCP loader fills a state dict of every tensor key at its global size: reference.pt
    (torch's dcp_to_torch_save stops on Megatron's metadata, whose planner_data is None). What
    common.pt holds, read by torch.load here (its args need Megatron's classes): common.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = dcp.FileSystemReader(CKPT)
    meta = reader.read_metadata()
    full = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}
    dcp.load(full, storage_reader=reader)  # no process group: one process reads all
    torch.save(full, os.path.join(OUT, CASE, "reference.pt"))
    common = torch.load(os.path.join(CKPT, "common.pt"), weights_only=False)
    optimizer = common["optimizer"]
    if all(isinstance(k, int) for k in optimizer) and "param_state_sharding_type" in optimizer[0]:  # a chain of distributed optimizers
        torch_states = [optimizer[k]["optimizer"] for k in sorted(optimizer)]
        groups = [g for t in torch_states for g in t["param_groups"]]
        steps = {g["step"] for g in groups}  # the chain synchronises its optimizers' steps: one
        assert len(steps) == 1, steps
        step = {"chained": [len(t["param_groups"]) for t in torch_states], "step": groups[0]["step"],
                "step_type": type(groups[0]["step"]).__name__,
                "param_state_sharding_type": [optimizer[k]["param_state_sharding_type"] for k in sorted(optimizer)]}
    elif all(isinstance(k, int) for k in optimizer):  # a ChainedOptimizer's: {index: each optimizer's own}
        groups = [g for k in sorted(optimizer) for g in optimizer[k]["param_groups"]]
        steps = [optimizer[k]["state"]["common_step"] for k in sorted(optimizer)]
        step = {"chained": [len(optimizer[k]["param_groups"]) for k in sorted(optimizer)],
                "common_step": [s.item() for s in steps], "common_step_dtype": str(steps[0].dtype)}
    elif "param_state_sharding_type" in optimizer:  # the distributed optimizer: the step in each param group
        groups = optimizer["optimizer"]["param_groups"]
        step = {"step": groups[0]["step"], "step_type": type(groups[0]["step"]).__name__,
                "param_state_sharding_type": optimizer["param_state_sharding_type"]}
    else:  # a common step for every parameter (Float16OptimizerWithFloat16Params: torch's state dict under 'optimizer')
        inner = optimizer["optimizer"] if "param_groups" not in optimizer else optimizer
        groups, s = inner["param_groups"], inner["state"]["common_step"]
        step = {"common_step": s.item(), "common_step_dtype": str(s.dtype)}
    extra = {"content_metadata": common["content_metadata"]} if "content_metadata" in common else {}
    with open(os.path.join(OUT, CASE, "common.json"), "w") as f:
        json.dump({"keys": list(common), "iteration": common["iteration"], **step, **extra, "param_groups": groups}, f, indent=1)
    for k, v in full.items():
        print(k, tuple(v.shape), v.dtype)
    tmp = os.path.join(OUT, CASE, "trained_state.tmp.pt")
    if os.path.exists(tmp):  # the distributed optimizer: its trained state, gathered from every rank's shards
        trained = torch.load(tmp)
        os.remove(tmp)
        assert sorted(trained) == sorted(k for k in full if k.startswith("optimizer.state.")), "every optimizer.state key"
        bad = sorted(k for k in trained if not torch.equal(trained[k], full[k]))
        print(f"[main] TRAINED STATE vs reference.pt (checkpoint/, fully_reshardable): the {len(trained)} optimizer.state.* "
              f"tensors, assembled from every rank's shards by Megatron's ranges: "
              + ("bitwise equal" if not bad else f"{len(bad)} differ: {bad}"), flush=True)
        if bad:  # what the optimizer held, where the fully_reshardable save wrote something else
            torch.save({k: trained[k] for k in sorted(trained)}, os.path.join(OUT, CASE, "reference_trained.pt"))


if __name__ == "__main__":
    if os.environ.get("REFERENCES_ONLY") != "1":
        if not BENCH:
            os.makedirs(CKPT, exist_ok=True)
        if BOTH:
            os.makedirs(CKPT_DP, exist_ok=True)
        mp.spawn(worker, args=(WORLD,), nprocs=WORLD)
    if FORM != "dp_reshardable" and not BENCH:  # a checkpoint ucp refuses needs no reference; the benchmark's none either
        references()
