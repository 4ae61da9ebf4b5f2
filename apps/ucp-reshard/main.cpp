// ucp-reshard: flags only; the work is ucp::reshard::RunReshard.
#include <CLI/CLI.hpp>
#include <iostream>

#include "reshard/reshard.h"
#include "shuffle/comm.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ucp-reshard: an atomic checkpoint to the native shard files of a new layout.\n\n"
      "Reads an atomic checkpoint written by ucp-convert and writes OUT/latest, OUT/global_stepN/ with\n"
      "the files DeepSpeed / Megatron-DeepSpeed write for the target layout: mp_rank_XX_model_states.pt,\n"
      "layer_II-model_TT-model_states.pt (weights in the training dtype) and [bf16_]zero_pp_rank_D_mp_rank_XX\n"
      "_optim_states.pt (fp32 weights, Adam moments, ZeRO flat partitions with DeepSpeed's alignment\n"
      "padding, param_slice_mappings), so the job relaunches with its ordinary --load. Vocabulary rows are\n"
      "re-padded with zeros for the target TP; split dimensions come from the manifest's model patterns,\n"
      "and a TP>1 target is refused for a parameter whose split dimension no rule decided.\n\n"
      "Each target model-parallel rank (pp stage, tp rank) is one unit: it reads each atomic slice it\n"
      "needs once and writes its model-states, layer and optimizer files; units are spread over the MPI\n"
      "ranks by bytes. `latest` is written last.\n\n"
      "Not yet: ZeRO-3 targets, and atomic checkpoints converted from ZeRO-3 (GPTModel naming).\n\n"
      "Exit status: 0 done; 1 refused or failed (the reason names the parameter or file); 2 bad command line.\n\n"
      "Examples:\n"
      "  mpirun -np 4 ucp-reshard ckpt/atomic -o new_ckpt --dp 4 --tp 2 --pp 2 --zero-stage 1 --dtype bf16\n"
      "  ucp-reshard ckpt/atomic --dp 2 --tp 2 --pp 1 --zero-stage 2 --dtype fp16 --plan-only --json"};
  ucp::reshard::ReshardOptions o;
  auto& t = o.target;
  app.add_option("atomic", o.atomic_dir, "atomic checkpoint folder (with ucp_manifest.json)")->required();
  app.add_option("-o,--output", o.output, "checkpoint folder to write (gets `latest` and global_stepN/)");
  app.add_option("--dp", t.dp, "data-parallel degree")->required()->check(CLI::PositiveNumber);
  app.add_option("--tp", t.tp, "tensor-parallel degree")->required()->check(CLI::PositiveNumber);
  app.add_option("--pp", t.pp, "pipeline-parallel degree")->required()->check(CLI::PositiveNumber);
  app.add_option("--zero-stage", t.zero_stage, "ZeRO stage: 0 (bf16 only: the BF16 optimizer), 1 or 2")->required();
  app.add_option("--dtype", t.dtype, "training dtype of the layer files: fp16, bf16 or fp32")
      ->capture_default_str()->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  app.add_option("--partition-method", t.partition_method,
                 "pipeline partitioning as DeepSpeed computes it: type:REGEX (Megatron-DeepSpeed uses type:transformer), "
                 "uniform, parameters, or explicit layer-spec boundaries such as 0,4,9")->capture_default_str();
  app.add_option("--make-vocab-size-divisible-by", t.vocab_divisible_by,
                 "vocabulary padding multiple per TP rank (default: the source's)");
  app.add_flag("--plan-only", o.plan_only, "print which rank writes what and the bytes it reads; no data read");
  app.add_flag("--json", o.json, "with --plan-only: as JSON");
  app.add_flag("--force", o.force, "overwrite a non-empty output folder (its `latest` is removed first)");
  app.add_option("--report", o.report_path, "write a JSON report: seconds, bytes read per rank, peak RSS");
  app.add_flag("-q,--quiet", o.quiet, "print errors only");
  CLI11_PARSE(app, argc, argv);
  if (!o.plan_only && o.output.empty()) {
    std::cerr << "ucp-reshard: error: an output folder is required (-o OUT), or --plan-only\n";
    return 2;
  }
  auto comm = ucp::shuffle::MakeWorldComm(&argc, &argv);
  return ucp::reshard::RunReshard(o, *comm, std::cout, std::cerr);
}
