// ucp-reshard: flags only; the work is ucp::reshard::RunCommand (reshard/command.h): the flags
// checked against the mode, then the mode run.
#include <CLI/CLI.hpp>
#include <iostream>
#include <vector>

#include <unistd.h>

#include "common/command_line.h"
#include "formats/registry.h"
#include "h5/h5.h"
#include "layout/target.h"
#include "reshard/command.h"
#include "shuffle/comm.h"

namespace {

using ucp::reshard::ReshardCommand;

constexpr const char* kDescription =
      "ucp-reshard: an atomic checkpoint to the native shard files of a new layout.\n\n"
      "Reads an atomic checkpoint written by ucp-convert (or a training run's checkpoint root, converted on\n"
      "the way) and writes OUT/latest, OUT/global_stepN/ with\n"
      "the files DeepSpeed / Megatron-DeepSpeed write for the target layout, so the job relaunches with its\n"
      "ordinary --load:\n"
      "  ZeRO 0-2, pipeline module (--model pipe, GPTModelPipe names): mp_rank_XX_model_states.pt,\n"
      "    layer_II-model_TT-model_states.pt (weights in the training dtype) and\n"
      "    [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt (fp32\n"
      "    weights, Adam moments, ZeRO flat partitions with DeepSpeed's alignment padding,\n"
      "    param_slice_mappings);\n"
      "  ZeRO 0-2, not a pipeline module (--model plain, pp=1, GPTModel names): the same optimizer files, and\n"
      "    mp_rank_XX_model_states.pt with the TP rank's weights under `module` (no layer_* files);\n"
      "  ZeRO-3 (GPTModel names, pp=1): zero_pp_rank_D_mp_rank_TT_model_states.pt and\n"
      "    [bf16_]zero_pp_rank_D_mp_rank_TT_optim_states.pt (every parameter cut in DP equal pieces).\n"
      "  A plain DeepSpeed engine around another model (a Hugging Face model under Trainer or Accelerate: its\n"
      "    parameters keep their own names): the same files for ZeRO 1-3 at any DP, TP/PP/SP as the source's;\n"
      "    from a Trainer checkpoint-N, OUT is a checkpoint-N again (Trainer's files, one rng_state per process).\n"
      "From a Megatron-Core or torchtitan atomic checkpoint: converted first into OUT/.ucp-scratch-atomic under\n"
      "Megatron-DeepSpeed's GPTModel names, the Adam moments and step with them (removed after), then written as\n"
      "above (torchtitan's model facts by --model-config FILE).\n"
      "The target model defaults to the source's. The atomic checkpoint may come from either naming; rules are\n"
      "renamed for the target. The layer count comes from the parameter names. Vocabulary rows are\n"
      "re-padded with zeros for the target TP; split dimensions come from the manifest's model patterns,\n"
      "and a TP>1 target is refused for a parameter whose split dimension no rule decided.\n\n"
      "Each target model-parallel rank (pp stage, tp rank) is one unit: it writes its model-states, layer\n"
      "and optimizer files, the ZeRO partitions streamed from hyperslab reads of the atomic tensors\n"
      "(either store); units are spread over the MPI ranks by bytes. Pieces several units need\n"
      "(TP-replicated parameters, the tied embedding) are read once by one rank and sent to the others\n"
      "(--share-buffer), so the atomic bytes are read once in total. `latest` is written last.\n\n"
      "The layout comes from flags, or from --layout FILE (schemas/layout.schema.json), e.g.\n"
      "  {\"dp\": 4, \"tp\": 2, \"pp\": 2, \"zero_stage\": 1, \"dtype\": \"bf16\", \"partition_method\": [0, 4, 7]}\n"
      "with flags overriding the file's values.\n\n"
      "--format hf writes a Hugging Face transformers model instead (config.json, safetensors files, the index last):\n"
      "LlamaForCausalLM, MixtralForCausalLM (every MLP a DeepSpeed or Megatron-Core MoE layer) or GPT2LMHeadModel (learned\n"
      "positions, LayerNorm, GeLU; Conv1D weights transposed), fused QKV and SwiGLU tensors split as the checkpoint\n"
      "records them, vocabulary padding removed, in the source job's dtype unless --dtype; no layout flags. A model no transformers class\n"
      "describes exactly is refused by name; facts the checkpoint lacks come from --model-config FILE.\n\n"
      "--format dcp writes a PyTorch Distributed Checkpoint of torchtitan's Llama (.metadata last, __R_0.distcp per\n"
      "rank of --mesh dp=N, tp=M or dp=N,tp=M): {\"model\", \"optim\"} as get_state_dict gives them, weights, exp_avg, exp_avg_sq,\n"
      "step and param groups, for torch.distributed.checkpoint.load; the same models as --format hf, no biases, untied.\n\n"
      "--format mcore writes Megatron-LM's torch_dist checkpoint at --tp T --pp P [--dp D] [--ep E] (iter_NNNNNNN/ and\n"
      "latest_checkpointed_iteration.txt last), which Megatron-LM's --load resumes: from Megatron-Core and Megatron-LM\n"
      "sources (GPT / Llama, dense or MoE with SequentialMLP experts over E of the DP ranks), the model in the job's\n"
      "dtype, the optimizer's state in the form the job's optimizer loads at any layout (the distributed optimizer's\n"
      "fully_reshardable, or the plain optimizer's), the args at the new layout (no RNG state: Megatron-LM keeps its own).\n"
      "From Megatron-DeepSpeed (DeepSpeed) checkpoints: the model, its args from the model's facts, and the optimizer's\n"
      "state (Adam's moments, the step, Megatron's param groups, the scheduler or the samples consumed) at the source's\n"
      "iteration, for the job's plain optimizer or, with --use-distributed-optimizer, the distributed one's. From Hugging\n"
      "Face imports, and any source with --weights-only (torchtitan's Llama needs it): the model alone as Megatron-LM's\n"
      "release checkpoint (release/). A note gives the flags to launch Megatron-LM with.\n\n"
      "Exit status: 0 done; 1 refused or failed (the reason names the parameter or file); 2 bad command line.\n\n"
      "Examples:\n"
      "  mpirun -np 4 ucp-reshard ckpt/atomic -o new_ckpt --dp 4 --tp 2 --pp 2 --zero-stage 1 --dtype bf16\n"
      "  ucp-reshard ckpt/atomic --dp 2 --tp 2 --pp 1 --zero-stage 2 --dtype fp16 --plan-only --json\n"
      "  ucp-reshard ckpt/atomic -o new_ckpt --layout target.json --dp 8\n"
      "  mpirun -np 2 ucp-reshard ckpt/atomic -o hf_model --format hf [--dtype bf16] [--max-shard-size 5GB]\n"
      "  ucp-reshard ckpt/atomic -o titan_ckpt --format dcp --mesh dp=8       for torchtitan on 8 ranks (FSDP2)\n"
      "  ucp-reshard mcore_atomic -o /ckpt/run2 --format mcore --tp 2 --pp 4   Megatron-LM's --load at TP=2 PP=4\n"
      "  ucp-reshard hf_atomic -o /ckpt/from_hf --format mcore --tp 2 --pp 1   a Hugging Face model into Megatron-LM\n"
      "  ucp-reshard ckpt/atomic --gpus 96 --gpus-per-node 4 --gpu-memory 40G --plan-only\n"
      "  ucp-reshard ckpt/atomic -o new_ckpt --dp 1 --sp 4 --tp 1 --pp 1 --zero-stage 1   Ulysses SP=4\n"
      "  ucp-reshard ckpt/atomic --gpus 64 --seq-length 131072 --recompute full --plan-only   SP where the sequence needs it\n"
      "  mpirun -np 8 ucp-reshard /ckpt/run1 --in-place --gpus 96 --keep 2    in a job script, before training\n"
      "  ucp-reshard out/checkpoint-500 -o out4/checkpoint-500 --gpus 4   a Trainer checkpoint for 4 processes\n"
      "  ucp-reshard out/checkpoint-500 -o hf_model --format hf           its Hugging Face weights, config.json carried\n"
      "  ucp-reshard /ckpt/run1 --in-place --gpus 96 --plan-only [--json]     what that step would do; writes nothing\n\n"
      "--gpus N chooses the layout: every dp x sp x tp x pp = N with TP dividing the heads, the key-value heads and\n"
      "the FFN width and staying within a node, SP (Ulysses, pp=1) dividing the query heads per TP rank and the\n"
      "sequence, PP at most the layers, each ZeRO stage DeepSpeed runs there; memory per GPU = weights + gradients\n"
      "+ optimizer states (per ZeRO stage) + activations (estimated from sequence length, micro-batch, hidden size,\n"
      "heads and layers over TP x SP, Korthikanti et al. 2023, where known; else an allowance); among those that\n"
      "fit: the source's TP and PP first, then the fewest stages, the smallest SP, the least ZeRO communication,\n"
      "the smallest TP.";

// A layout flag: its value goes into `flags` under its key in a --layout file.
template <typename T>
CLI::Option* LayoutFlag(CLI::App& app, nlohmann::json& flags, const char* name, const char* key, const std::string& help) {
  return app.add_option_function<T>(name, [&flags, key](const T& v) { flags[key] = v; }, help);
}

// What to read, the mode and where to write. Returns --keep, which only --in-place takes.
CLI::Option* AddInputFlags(CLI::App& app, ReshardCommand& c) {
  app.add_option("atomic", c.options.atomic_dir,
                 "atomic checkpoint folder (with ucp_manifest.json) or DeepSpeed's universal folder; or the training "
                 "run's checkpoint root (with `latest`, a Trainer's checkpoint-N): --in-place finds or makes its "
                 "atomic checkpoint beside the tag; with -o, ucp reads its atomic checkpoint there when it matches the "
                 "tag, else converts into OUT/.ucp-scratch-atomic, removed at the end")
      ->required();
  app.add_flag("--no-strict", c.no_strict, "from a training run's root: convert it despite layout or pattern problems "
               "(ucp-convert --no-strict; they are printed)");
  app.add_flag("--in-place", c.in_place_mode,
               "lazy reconfiguration of a checkpoint root (with `latest`, native or atomic): nothing to do if `latest` has "
               "the target layout; else convert it (or reuse ROOT/<tag>_universal when it holds the same files), "
               "reshard into ROOT/<tag>_dp.._tp.._pp.._z.._<dtype> (_sp.. after dp with Ulysses SP) and point `latest` at it; the "
               "old tag stays");
  CLI::Option* keep = app.add_option("--keep", c.in_place.keep, "with --in-place: keep at most this many tags written in place, the newest (default: all)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("-o,--output", c.options.output, "checkpoint folder to write (gets `latest` and global_stepN/; with --format hf, "
                 "the model's files)");
  app.add_option("--format", c.options.format,
                 "what to write: deepspeed (the default: a training layout's native files), hf (a Hugging Face "
                 "transformers model: config.json and safetensors, for from_pretrained; no layout flags) or dcp (a "
                 "PyTorch Distributed Checkpoint of torchtitan's Llama with its optimizer state, for "
                 "torch.distributed.checkpoint.load on the --mesh given) or mcore (Megatron-LM's torch_dist checkpoint at "
                 "--tp, --pp, --dp, for its --load)")
      ->transform(CLI::IsMember(ucp::formats::TargetNames(), CLI::ignore_case));
  return keep;
}

// --format hf's own flags, returned to be refused by name with any other format.
std::vector<CLI::Option*> AddModelFlags(CLI::App& app, ReshardCommand& c) {
  CLI::Option* model_config = app.add_option("--model-config", c.model_config,
                 "with --format hf, dcp or mcore (and a DeepSpeed layout of a Megatron-Core or torchtitan atomic checkpoint): a JSON "
                 "object of model facts the checkpoint does not hold, by Megatron's argument "
                 "names (hidden_size, num_layers, num_attention_heads, num_key_value_heads, ffn_hidden_size, "
                 "max_position_embeddings, normalization, swiglu, position_embedding_type, layernorm_epsilon, "
                 "rope_theta; GPT-2: bias_gelu_fusion, openai_gelu; Mixtral: topk, moe_token_dropping, "
                 "moe_top2_2nd_expert_sampling); a value the checkpoint's args also give must agree. For a checkpoint whose parameters "
                 "carry Hugging Face's own names (a Trainer job's): the model's config.json, when the atomic checkpoint "
                 "carries none (job/config.json); it is written unchanged, with the generation_config.json beside it")
      ->check(CLI::ExistingFile);
  CLI::Option* max_shard = app.add_option("--max-shard-size", c.options.model.max_file_bytes,
                 "with --format hf: tensor bytes per safetensors file (e.g. 5GB, the default, 500MB; 1000-based as "
                 "Hugging Face counts); a larger tensor gets a file of its own")
      ->transform(CLI::AsSizeValue(true))
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 50));
  return {model_config, max_shard};
}

// --format dcp's own flag, returned to be refused by name with any other format.
CLI::Option* AddMeshFlag(CLI::App& app, ReshardCommand& c) {
  return app.add_option("--mesh", c.options.model.mesh,
                        "with --format dcp: the torchtitan mesh to write for: dp=N (FSDP2, every parameter Shard(0)), "
                        "tp=M (torchtitan's tensor-parallel plan: Shard(0) for wq, wk, wv, w1, w3, tok_embeddings, output, "
                        "Shard(1) for wo and w2, norms replicated) or dp=N,tp=M (FSDP2 over TP, rank = d * M + t); "
                        "default dp=1");
}

// --format mcore's own flags, returned to be refused by name with any other format.
std::vector<CLI::Option*> AddMcoreFlags(CLI::App& app, ReshardCommand& c) {
  return {app.add_flag("--weights-only", c.options.model.weights_only,
                       "with --format mcore: write the model alone, without the optimizer's state the checkpoint holds (Megatron-LM "
                       "then starts a fresh optimizer from it); needed where the state cannot travel, as from torchtitan's DCP"),
          app.add_flag("--use-distributed-optimizer", c.options.model.distributed_optimizer,
                       "with --format mcore from a Megatron-DeepSpeed (DeepSpeed) checkpoint: write the optimizer's state for a "
                       "Megatron-LM job launched with --use-distributed-optimizer (its fully_reshardable form); without it, for the "
                       "job's plain optimizer (FP32Optimizer in fp32, the mixed-precision one in bf16 / fp16). A Megatron-Core "
                       "source's args already say which")};
}

// The target layout: --layout FILE, and one flag per layout key over it. Returns --layout.
CLI::Option* AddLayoutFlags(CLI::App& app, ReshardCommand& c) {
  CLI::Option* layout = app.add_option("--layout", c.layout_file, "target layout as JSON (schemas/layout.schema.json); flags override it")
      ->check(CLI::ExistingFile);
  LayoutFlag<int>(app, c.layout_flags, "--dp", "dp", "data-parallel degree (required for a DeepSpeed layout, here or in --layout; --format mcore: 1 if not given)")->check(ucp::apps::AtLeast(1));
  LayoutFlag<int>(app, c.layout_flags, "--tp", "tp", "tensor-parallel degree (required, here or in --layout)")->check(ucp::apps::AtLeast(1));
  LayoutFlag<int>(app, c.layout_flags, "--pp", "pp", "pipeline-parallel degree (required, here or in --layout)")->check(ucp::apps::AtLeast(1));
  LayoutFlag<int>(app, c.layout_flags, "--sp", "sp",
       "DeepSpeed Ulysses sequence-parallel degree: each of the --dp replicas runs on sp ranks (GPUs = dp x sp x tp x "
       "pp), ZeRO partitions span dp x sp ranks; it divides the query heads per TP rank and the sequence length, "
       "pp=1 (default: the source's, from its Megatron args, else 1)")->check(ucp::apps::AtLeast(1));
  LayoutFlag<int>(app, c.layout_flags, "--zero-stage", "zero_stage",
       "ZeRO stage: 0 (without ZeRO: bf16 with DeepSpeed's BF16 optimizer; a Mixture-of-Experts model in fp32 with its "
       "torch optimizer, the state in expp_rank files), 1, 2, or 3 (pp=1) (required, here or in --layout)")
      ->check(CLI::Range(0, 3));
  LayoutFlag<int>(app, c.layout_flags, "--ep", "ep",
       "Mixture of Experts: the expert-parallel degree of the target job (DeepSpeed's ep_size), dividing --dp x --tp "
       "and each MoE layer's expert count, at least --tp; with --format mcore, Megatron-LM's --expert-model-parallel-size, "
       "dividing --dp and the experts (default: the source's)")->check(ucp::apps::AtLeast(1));
  LayoutFlag<std::string>(app, c.layout_flags, "--dtype", "dtype", "training dtype: fp16, bf16 or fp32 (default: the source job's; another is said as \"fp32 -> bf16\")")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  LayoutFlag<std::string>(app, c.layout_flags, "--grad-accum-dtype", "grad_accum_dtype",
       "the dtype gradients accumulate in (DeepSpeed's data_types.grad_accum_dtype); with --dtype bf16 --zero-stage 1, "
       "fp32 writes DeepSpeed's BF16 optimizer files, bf16 ZeRO's. Default: the source's")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  LayoutFlag<std::string>(app, c.layout_flags, "--ds-version", "ds_version",
       "the DeepSpeed release the resumed job runs (e.g. 0.14.5), where the checkpoint does not record it or the job "
       "runs another: it decides what changed between releases that no file shows (Mixture of Experts: the scale of "
       "an expert's Adam moments, expp_rank files under ZeRO). Default: the source's")
      ->check(CLI::Validator(
          [](std::string& v) { return ucp::reshard::IsReleaseVersion(v) ? std::string() : "not a release such as 0.14.5"; },
          "RELEASE"));
  LayoutFlag<std::string>(app, c.layout_flags, "--partition-method", "partition_method",
       "pipeline partitioning as DeepSpeed computes it: type:REGEX (default type:transformer, as Megatron-DeepSpeed), "
       "uniform, parameters, or explicit layer-spec boundaries such as 0,4,9");
  LayoutFlag<std::string>(app, c.layout_flags, "--model", "model",
       "the target model: pipe (a DeepSpeed PipelineModule: layer_* files, GPTModelPipe names) or plain (not one: "
       "weights under `module` of mp_rank_XX_model_states.pt, GPTModel names); default the source's, pp>1 always "
       "pipe, ZeRO-3 always plain")
      ->check(CLI::IsMember({"pipe", "plain"}));
  LayoutFlag<int64_t>(app, c.layout_flags, "--make-vocab-size-divisible-by", "make_vocab_size_divisible_by",
       "vocabulary padding multiple per TP rank (default: the source's)")->check(ucp::apps::AtLeast(1));
  return layout;
}

// The exchange of the pieces several target ranks need; returned, as only a layout's run has one.
std::vector<CLI::Option*> AddExchangeFlags(CLI::App& app, ReshardCommand& c) {
  CLI::Option* share = app.add_option("--share-buffer", c.options.share_bytes,
                 "memory per rank for pieces several target ranks need (TP-replicated parameters, the tied "
                 "embedding), read once and sent over MPI (e.g. 64M, 1G; default 256M; 0: each reads its own)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 44));
  CLI::Option* buffer = app.add_option("--buffer", c.options.exchange_round_bytes,
                 "bytes each rank sends (and receives) per round of that exchange (e.g. 64K, 16M; default 8M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
  return {share, buffer};
}

// --gpus: the layout chosen by the planner, and the facts it weighs.
void AddPlannerFlags(CLI::App& app, ucp::reshard::PlannerRequest& g) {
  CLI::Option* gpus_flag = app.add_option("--gpus", g.gpus,
                 "choose the layout for this many GPUs instead of giving --dp/--tp/--pp/--zero-stage (those given "
                 "are kept): the valid layouts, their memory per GPU, and the preferred one that fits; with "
                 "--plan-only, the ranked candidates and the reason")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--gpus-per-node", g.gpus_per_node, "with --gpus: GPUs per node; TP stays within a node (default 8)")
      ->check(CLI::Range(1, 1 << 10))
      ->needs(gpus_flag);
  app.add_option("--gpu-memory", g.gpu_memory, "with --gpus: memory of one GPU (e.g. 80G, the default; 40G, 24G)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 50))
      ->needs(gpus_flag);
  app.add_option("--activation-memory", g.activation_memory,
                 "with --gpus: memory per GPU set aside for activations and buffers (default a quarter of --gpu-memory)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50))
      ->needs(gpus_flag);
  app.add_option("--seq-length", g.seq_length,
                 "with --gpus: the sequence length the job will train with, for the activation estimate (default: the "
                 "checkpoint's args)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->needs(gpus_flag);
  app.add_option("--micro-batch-size", g.micro_batch,
                 "with --gpus: samples per micro-batch of one model replica, for the activation estimate (default: the "
                 "checkpoint's args)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->needs(gpus_flag);
  app.add_option("--recompute", g.recompute,
                 "with --gpus: full (every layer's activations recomputed in the backward pass: only layer inputs kept) "
                 "or none (default: the checkpoint's args, else none)")
      ->check(CLI::IsMember({"full", "none"}))
      ->needs(gpus_flag);
}

// The optimizer files of a training layout: none, or a weights-only checkpoint's fresh optimizer.
void AddOptimizerFlags(CLI::App& app, ReshardCommand& c) {
  app.add_flag("--no-optimizer", c.no_optimizer,
               "write the model's files only (model-states and layer files, the weights in the training dtype), no "
               "optimizer files: for a job that loads the module alone (DeepSpeed's "
               "load_checkpoint(load_optimizer_states=False) or load_module_only=True; Megatron-DeepSpeed's --finetune: "
               "its --no-load-optim does not reach DeepSpeed). Any atomic "
               "checkpoint; not with ZeRO-3 (whose weights live in the optimizer files), --format hf or --in-place");
  app.add_option("--optimizer-config", c.options.optimizer_config,
                 "a weights-only atomic checkpoint (a Hugging Face model's): the optimizer a DeepSpeed job starts with, "
                 "fp32 masters = the weights, exp_avg = exp_avg_sq = 0, step 0, its param_groups' lr, betas, eps and "
                 "weight_decay from FILE: a DeepSpeed ds_config.json with an \"optimizer\" block, or that block "
                 "({\"type\": \"AdamW\", \"params\": {...}}); the groups of biases and norms get no weight decay. A "
                 "weights-only checkpoint needs it or --no-optimizer")
      ->check(CLI::ExistingFile);
}

// What a run prints, and what it may replace.
void AddRunFlags(CLI::App& app, ucp::reshard::ReshardOptions& o) {
  app.add_flag("--plan-only", o.plan_only,
               "print which rank writes what and the bytes it reads (with --gpus: the layouts considered); no data read");
  app.add_flag("--json", o.json, "with --plan-only: as JSON (with --in-place: schemas/in-place-plan.schema.json)");
  app.add_flag("--force", o.force, "replace what an earlier ucp-reshard run wrote into the output folder, as its claim "
               "(.ucp-reshard.json) lists it (the commit point, `latest` or the index, removed first); anything else there, "
               "and a `latest` naming a tag it did not write, is refused by name");
  app.add_option("--report", o.report_path, "write a JSON report: seconds, bytes read per rank, peak RSS");
  app.add_flag("-q,--quiet", o.quiet, "print errors only");
}

// The names of the flags among `flags` that the command line gave, in that order.
std::vector<std::string> NamesGiven(const std::vector<CLI::Option*>& flags) {
  std::vector<std::string> names;
  for (CLI::Option* flag : flags)
    if (flag->count() > 0) names.push_back(flag->get_name());
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription};
  ucp::apps::AddVersionFlag(app, "ucp-reshard");
  ReshardCommand c;
  CLI::Option* keep = AddInputFlags(app, c);
  const std::vector<CLI::Option*> hf_only = AddModelFlags(app, c);
  CLI::Option* mesh = AddMeshFlag(app, c);
  const std::vector<CLI::Option*> mcore_only = AddMcoreFlags(app, c);
  CLI::Option* layout = AddLayoutFlags(app, c);
  const std::vector<CLI::Option*> exchange = AddExchangeFlags(app, c);
  AddPlannerFlags(app, c.options.planner);
  AddOptimizerFlags(app, c);
  AddRunFlags(app, c.options);
  if (auto status = ucp::apps::ParseCommandLine(app, argc, argv, "ucp-reshard")) return *status;
  c.layout_only_given = NamesGiven({layout, keep, exchange[0], exchange[1]});
  c.hf_only_given = NamesGiven(hf_only);
  c.dcp_only_given = NamesGiven({mesh});
  c.mcore_only_given = NamesGiven(mcore_only);
  if (auto status = ucp::reshard::SettleCommand(c, std::cerr)) return *status;
  c.options.progress = ::isatty(STDERR_FILENO);
  ucp::h5::InitializeBeforeMpi();  // before MPI_Init: see h5/h5.h
  auto comm = ucp::shuffle::MakeWorldComm(&argc, &argv);
  return ucp::reshard::RunCommand(c, *comm, std::cout, std::cerr);
}
