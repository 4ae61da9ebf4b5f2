// ucp-reshard's command line once parsed: what the flags ask, checked against each other (the
// refusals of a bad combination, exit 2, and of an unreadable --layout or --model-config file, exit
// 1), then the mode it asks for run: a model export (--format hf), --in-place, a run from a training
// run's root, or a reshard of an atomic checkpoint. The app parses the flags into it (CLI11) and
// starts MPI between the two steps, so that a refused command line starts nothing.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reshard/in_place.h"
#include "reshard/reshard.h"
#include "shuffle/comm.h"

namespace ucp::reshard {

struct ReshardCommand {
  ReshardOptions options;
  InPlaceOptions in_place;    // --keep; the rest filled from `options` for a run from a root
  bool in_place_mode = false;  // --in-place
  bool no_strict = false;      // --no-strict
  std::string layout_file;     // --layout FILE, or empty
  std::string model_config;    // --model-config FILE, or empty
  // The layout flags given (--dp, --dtype, ...), as one more layout object over the --layout file.
  nlohmann::json layout_flags = nlohmann::json::object();
  // Given flags that only a layout takes (--layout, --keep, --share-buffer, --buffer), and that
  // only a model target takes (--model-config; --max-shard-size: hf's only), and only --format dcp
  // takes (--mesh), by name, in that order.
  std::vector<std::string> layout_only_given, hf_only_given, dcp_only_given, mcore_only_given;
  // --no-optimizer (options.target.no_optimizer), --optimizer-config FILE (options.optimizer_config):
  // a training layout's only, each given on its own.
  bool no_optimizer = false;
};

// Reads the --layout file and applies the layout flags over it, and checks the flags against the
// mode: an exit status when the command is refused (the reason written to `err`), else nothing and
// `c` ready to run.
std::optional<int> SettleCommand(ReshardCommand& c, std::ostream& err);

// Runs the mode a settled command asks for. Exit codes as RunReshard's.
int RunCommand(const ReshardCommand& c, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

}  // namespace ucp::reshard
