// ucp-convert: flags only; the work is ucp::convert::RunConvert.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <optional>
#include <string>
#include <iostream>

#include "common/command_line.h"

#include "convert/convert.h"
#include "patterns/rules.h"
#include "h5/h5.h"
#include "shuffle/comm.h"

namespace {

constexpr const char* kAbout =
    "ucp-convert: a DeepSpeed / Megatron-DeepSpeed checkpoint, a PyTorch Distributed Checkpoint, or a\n"
    "Hugging Face model, to an atomic checkpoint.\n\n"
    "Reads the checkpoint saved under any ZeRO-1/2/3 x TP x PP layout (fp16 or bf16, BF16 optimizer\n"
    "included) and writes one fp32 tensor per parameter and state, free of ranks, degrees and padding,\n"
    "in DeepSpeed's universal layout: OUT/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt,\n"
    "OUT/zero/optimizer_state.pt, the mp_rank_* model-states files, OUT/ucp_manifest.json (written\n"
    "last: it commits the folder) and, where OUT sits in the tag's own checkpoint root (beside `latest`\n"
    "and the tag's folder), <parent of OUT>/latest_universal, so DeepSpeed resumes from it with\n"
    "\"checkpoint\": {\"load_universal\": true}; elsewhere nothing is written outside OUT. ucp-reshard\n"
    "writes any new layout from it.\n\n"
    "Run it with mpirun for a parallel conversion (ranks map source files, shuffle fragments and\n"
    "reduce parameters, balanced by bytes) or alone as a single process. Patterns (Replicate,\n"
    "Shard-V/H/NC, Partial) come from the checkpoint's universal_checkpoint_info and the model-family\n"
    "rules in patterns/; replicated copies are checked to be identical, and every element of every\n"
    "parameter must come from exactly one fragment.\n\n"
    "A PyTorch Distributed Checkpoint (FSDP2, torchtitan, DTensor TP: .metadata and __R_N.distcp) is\n"
    "read chunk by chunk, each a box of its global tensor: fp32 weights with Adam's exp_avg, exp_avg_sq\n"
    "and step per parameter, the param groups into zero/optimizer_state.pt; no model-states file and no\n"
    "latest_universal (DeepSpeed cannot resume it); ucp-reshard --format hf exports it.\n"
    "Megatron-Core's torch_dist checkpoints (the iter_NNNNNNN folder: metadata.json, common.pt, .metadata)\n"
    "are read the same way: layers stacked in one tensor per key, the optimizer's fp32 masters as the\n"
    "weights (DistributedOptimizer saved fully_reshardable), the step and param groups from common.pt,\n"
    "which is carried for ucp-reshard --format hf to read Megatron's args from.\n"
    "A Hugging Face model folder (save_pretrained: config.json and model.safetensors, or shards with\n"
    "model.safetensors.index.json; LlamaForCausalLM, GPT2LMHeadModel, MixtralForCausalLM; F32/BF16/F16)\n"
    "is imported weights only: each parameter under Megatron-DeepSpeed's name (fused query_key_value\n"
    "and dense_h_to_4h; GPT-2's Conv1D weights transposed, its QKV head by head; Mixtral's experts as\n"
    "DeepSpeed MoE experts under their global ids), fp32 alone\n"
    "(no exp_avg, exp_avg_sq or step), a synthesized mp_rank_00_model_states.pt (Megatron's args,\n"
    "universal_checkpoint_info), config.json carried as job/config.json. safetensors has no checksum:\n"
    "its structure is checked, and the XXH64 of what is written is recorded.\n\n"
    "--format hdf5 writes the tensors into one HDF5 file instead, OUT/atoms.h5 (a group per parameter,\n"
    "datasets fp32 / exp_avg / exp_avg_sq, metadata as attributes; schemas/atoms-h5.schema.json),\n"
    "written by all ranks at once through MPI-IO. ucp-inspect reads either store; DeepSpeed reads\n"
    "only the .pt one (no latest_universal is written for hdf5). --resume is refused\n"
    "with --format hdf5 (the one file is written whole: rerun with --force). --from-atomic DIR converts\n"
    "an existing atomic checkpoint to the other store, tensors byte for byte, without the source.\n\n"
    "Exit status: 0 done; 1 failed (the message names the file, rank coordinates and parameter; no\n"
    "manifest is written); 2 bad command line.\n\n"
    "Examples:\n"
    "  ucp-convert ckpt/ -o ckpt/atomic                 single process\n"
    "  mpirun -np 8 ucp-convert ckpt/ -o /fs/atomic     8 ranks\n"
    "  ucp-convert ckpt/ --plan-only --json             who maps and reduces what, no data read\n"
    "  mpirun -np 8 ucp-convert ckpt/ -o out --resume   finish a killed run\n"
    "  ucp-convert ckpt/ -o out --format hdf5           one atoms.h5\n"
    "  mpirun -np 4 ucp-convert --from-atomic out --format pt -o out-pt   back to .pt files\n"
    "  ucp-inspect ckpt/atomic --verify                 check every file against the manifest";

// The command line as given, before the checks that need more than one flag.
struct CommandLine {
  ucp::convert::ConvertOptions o;
  bool no_strict = false;
  int plan_ranks = 0;
  std::string split_above = "auto";
};

void AddOptions(CLI::App& app, CommandLine& cl) {
  app.add_option("source", cl.o.source, "checkpoint folder (DeepSpeed: with `latest`, or the global_stepN folder; "
                 "PyTorch DCP: the folder with .metadata)");
  app.add_option("--format", cl.o.format, "store of the atomic tensors: pt (DeepSpeed's universal files) or hdf5 (one atoms.h5)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "pt" || v == "hdf5") return "";
            if (v == "hf" || v == "huggingface")
              return "ucp-convert --format picks the atomic checkpoint's store (pt or hdf5); a Hugging Face model is "
                     "written from it by ucp-reshard ATOMIC -o OUT --format hf";
            return v + " not in {pt,hdf5}";
          },
          "{pt,hdf5}"))
      ->capture_default_str();
  app.add_option("--from-atomic", cl.o.from_atomic, "convert this atomic checkpoint (either store) to --format, instead of a source");
  app.add_option("-o,--output", cl.o.output, "atomic checkpoint folder to write");
  app.add_flag("--force", cl.o.force, "overwrite a non-empty output folder (its manifest is removed first)");
  app.add_flag("--resume", cl.o.resume, "finish an interrupted conversion into the same folder, skipping files verified done");
  app.add_flag("--plan-only", cl.o.plan_only, "print the plan (per-rank bytes in and out, imbalance) without reading tensor data");
  app.add_option("--ranks", cl.plan_ranks, "with --plan-only: plan for this many ranks instead of the running ones")
      ->check(ucp::apps::AtLeast(1));
  app.add_flag("--json", cl.o.json, "with --plan-only: print the plan as JSON");
  app.add_option("--threads", cl.o.threads, "writer threads per rank (default: the cores the rank may use)")
      ->check(ucp::apps::AtLeast(1));
  app.add_option("--buffer", cl.o.buffer_bytes, "shuffle bytes in flight per rank (e.g. 64M, 1G; default 128M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
  app.add_option("--split-above", cl.split_above,
                 "the size above which work is shared between ranks (e.g. 256M; 0: never; auto: a quarter of an even share "
                 "of the bytes written per rank, 64M to 1G), in two ways. Reading: an optimizer file of more bytes is read "
                 "by the ranks whose even shares of all the files' bytes it spans (a run of less than a quarter of the size "
                 "at a file's end stays with its neighbour), its records' CRC-32s combined across them; any store. Writing: "
                 "a (parameter, state) of more bytes is written in parts (rows; at most one per rank, placed like any item, "
                 "so parts may share a rank) into its one file; the .pt store of a ZeRO-0/1/2 source only (ZeRO-3's "
                 "universal form and the HDF5 store write each tensor whole, a note says so)")
      ->capture_default_str();
  app.add_option("--report", cl.o.report_path, "write a JSON report: timings per phase, bytes read, moved and written per rank");
  app.add_option("--patterns", cl.o.pattern_files, "rule file(s) to use instead of detecting the model family")
      ->check(CLI::ExistingFile);
  app.add_option("--patterns-dir", cl.o.patterns_dir, "folder of model-family rule files")->capture_default_str();
  app.add_flag("--no-strict", cl.no_strict, "convert despite layout or pattern problems (they are printed)");
  app.add_flag("-q,--quiet", cl.o.quiet, "print errors only");
}

// --split-above: auto, or a whole size. Returns the exit status of a refusal.
std::optional<int> ReadSplitAbove(CommandLine& cl) {
  std::string split_lower = cl.split_above;
  for (auto& ch : split_lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (split_lower == "auto") return std::nullopt;
  std::string bytes = cl.split_above;
  bool ok = !bytes.empty() && bytes[0] != '-';
  try {  // CLI11's size parser throws on what it cannot read (1.5G, foo)
    ok = ok && CLI::AsSizeValue(false)(bytes).empty() && !bytes.empty();
    if (ok) cl.o.split_above = std::stoll(bytes);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) {
    std::cerr << "ucp-convert: error: --split-above " << cl.split_above << ": a whole size (e.g. 256M, 1536M, 1G), 0 or auto\n";
    return 2;
  }
  if (cl.o.split_above > 0 && !cl.o.from_atomic.empty()) {
    std::cerr << "ucp-convert: error: --split-above goes with a conversion from a source checkpoint (--from-atomic "
                 "copies each tensor whole from one store into another): drop it\n";
    return 2;
  }
  return std::nullopt;
}

// Flags that contradict each other, or that go only with others. Returns the exit status of a refusal.
std::optional<int> RefuseContradictions(const ucp::convert::ConvertOptions& o, int plan_ranks) {
  const char* why = nullptr;
  if (o.source.empty() == o.from_atomic.empty())
    why = "give either a source checkpoint folder or --from-atomic DIR (see --help)";
  else if (!o.from_atomic.empty() && (o.plan_only || o.resume || plan_ranks > 0))
    why = "--from-atomic takes no --plan-only, --ranks or --resume";
  else if (!o.plan_only && o.output.empty())
    why = "an output folder is required (-o OUT), or --plan-only";
  else if (o.json && !o.plan_only)
    why = "--json goes with --plan-only (a run prints its summary as text; --report FILE writes it as JSON)";
  else if (plan_ranks > 0 && !o.plan_only)
    why = "--ranks only applies with --plan-only";
  else if (o.force && o.resume)
    why = "--force and --resume contradict each other";
  if (!why) return std::nullopt;
  std::cerr << "ucp-convert: error: " << why << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kAbout};
  ucp::apps::AddVersionFlag(app, "ucp-convert");
  CommandLine cl;
  cl.o.patterns_dir = ucp::patterns::DefaultPatternsDir();
  AddOptions(app, cl);
  if (auto status = ucp::apps::ParseCommandLine(app, argc, argv, "ucp-convert")) return *status;
  ucp::convert::ConvertOptions& o = cl.o;
  o.strict = !cl.no_strict;
  if (auto status = ReadSplitAbove(cl)) return *status;
  o.progress = ::isatty(STDERR_FILENO);
  if (auto status = RefuseContradictions(o, cl.plan_ranks)) return *status;
  ucp::h5::InitializeBeforeMpi();  // before MPI_Init: see h5/h5.h
  auto comm = cl.plan_ranks > 0 ? ucp::shuffle::MakeLocalComm() : ucp::shuffle::MakeWorldComm(&argc, &argv);
  o.plan_ranks = cl.plan_ranks;
  if (!o.from_atomic.empty()) return ucp::convert::RunConvertFromAtomic(o, *comm, std::cout, std::cerr);
  return ucp::convert::RunConvert(o, *comm, std::cout, std::cerr);
}
