// The formats ucp reads and writes, in one table each (ADIOS2's engine table; the interfaces are in
// formats/driver.h). Adding a format: a folder under formats/ with its driver (declared in driver.h),
// its row in the table of registry.cpp it belongs to (sources, targets), its files in
// lib/CMakeLists.txt and its folder in scripts/check_layers.py's LAYERS; `ucp-inspect --list-formats`
// prints the rows (tests/README.md says which tests to copy).
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/driver.h"
#include "source/source_index.h"

namespace ucp::formats {

// The index of `dir` by the first source driver whose probe accepts it. When none does, the last
// (the broadest, DeepSpeed) indexes it anyway, so that its error says what is missing.
source::SourceIndex IndexSource(const std::string& dir, const source::IndexOptions& options = {});

// For a folder that is no checkpoint (a Trainer output_dir, a run's directory): the sub-folder that is
// one, the newest where several are (Trainer's trainer_state.json global_step, else the number in its
// name), said as "DIR/checkpoint-500 is a deepspeed checkpoint: give that folder"; "" when none is.
std::string CheckpointBelow(const std::string& dir);

// The source driver whose probe accepts `dir` (its names only), or nullptr.
const SourceDriver* ProbeSource(const std::string& dir);

// A Megatron-LM torch_dist root (latest_checkpointed_iteration.txt beside iter_NNNNNNN folders): the
// iteration folder its tracker names, as Megatron-LM's --load reads it, where that is a DCP; else
// empty (a legacy root is a source itself).
std::string TrackedIteration(const std::string& dir);

// The target driver called `name`; throws ucp::Error listing the known ones.
const TargetDriver& FindTarget(std::string_view name);
// The target drivers' names, in the table's order (ucp-reshard's --format choices).
std::vector<std::string> TargetNames();

// Every driver, for `ucp-inspect --list-formats`.
nlohmann::json FormatsJson();
void PrintFormats(std::ostream& out);

}  // namespace ucp::formats
