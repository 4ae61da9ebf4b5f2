// ucp-inspect: flags only; the work is ucp::inspect::RunInspect.
#include <CLI/CLI.hpp>
#include <iostream>

#include "common/command_line.h"

#include "formats/registry.h"
#include "inspect/inspect.h"
#include "patterns/rules.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ucp-inspect: what a checkpoint holds.\n\n"
      "Reads a DeepSpeed / Megatron-DeepSpeed checkpoint folder (the folder with `latest`, or the\n"
      "global_stepN folder itself), or a PyTorch Distributed Checkpoint's (with .metadata: how its\n"
      "tensors are cut into chunks, the torch release's Metadata fields; Megatron-Core's torch_dist:\n"
      "also its optimizer's form), without loading tensor\n"
      "data, and prints the layout it was saved with (framework, ZeRO stage, training dtype, DP/TP/PP\n"
      "degrees, iteration), its files, and every\n"
      "parameter with its full shape, the pattern it has here and under TP > 1, the rule that decided\n"
      "it, and its atomic size. Missing rank files, mismatched degrees, fragments that do not cover a\n"
      "parameter, parameters no rule classifies and rules that match nothing are reported.\n\n"
      "Exit status: 0 clean; 1 problems found (warnings instead with --no-strict); 2 unreadable input.\n\n"
      "Examples:\n"
      "  ucp-inspect ckpt/                      table\n"
      "  ucp-inspect ckpt/ --json | jq .degrees  machine-readable (schemas/inspect.schema.json)\n"
      "  ucp-inspect ckpt/ --params 'layernorm'  only matching parameters\n"
      "  ucp-inspect ckpt/ --patterns patterns/megatron-llama-pipe.json\n"
      "  ucp-inspect --list-patterns\n"
      "  ucp-inspect --list-formats [--json]      the source and target formats ucp knows"};
  ucp::apps::AddVersionFlag(app, "ucp-inspect");
  std::string dir;
  ucp::inspect::InspectOptions options;
  options.patterns_dir = ucp::patterns::DefaultPatternsDir();
  bool no_strict = false, list_patterns = false, list_formats = false;
  app.add_option("dir", dir, "checkpoint folder (DeepSpeed's, a PyTorch DCP's with .metadata, or an atomic checkpoint)");
  app.add_flag("--json", options.json, "print the report as JSON");
  app.add_option("--params", options.params_regex, "only list parameters whose name matches this regex");
  app.add_option("--patterns", options.pattern_files,
                 "rule file(s) in DeepSpeed's universal_checkpoint_info keys, instead of detecting the model family")
      ->check(CLI::ExistingFile);
  app.add_option("--patterns-dir", options.patterns_dir, "folder of model-family rule files to detect from")
      ->capture_default_str();
  app.add_flag("--no-strict", no_strict, "report problems as warnings and exit 0");
  app.add_flag("--verify", options.verify, "also read every tensor's bytes and check its CRC32");
  app.add_flag("--list-patterns", list_patterns, "list the pattern vocabulary and the rule files available");
  app.add_flag("--list-formats", list_formats, "list the checkpoint formats ucp reads and writes (its drivers)");
  if (auto status = ucp::apps::ParseCommandLine(app, argc, argv, "ucp-inspect")) return *status;
  options.strict = !no_strict;
  if (list_formats) {
    if (options.json)
      std::cout << ucp::formats::FormatsJson().dump(1) << "\n";
    else
      ucp::formats::PrintFormats(std::cout);
    return 0;
  }
  if (list_patterns) return ucp::inspect::ListPatterns(options.patterns_dir, options.json, std::cout, std::cerr);
  if (dir.empty()) {
    std::cerr << "ucp-inspect: error: a checkpoint folder is required (see --help)\n";
    return 2;
  }
  return ucp::inspect::RunInspect(dir, options, std::cout, std::cerr);
}
