// A DeepSpeed checkpoint's parameters and their per-TP-rank shapes: from each model-states file's
// param_shapes, which also lists each optimizer group's parameters in flat order; where a save has
// none, from the weights themselves (the module, a pipeline's layer files, the expert files).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "formats/deepspeed/shard_files.h"

namespace ucp::deepspeed {

struct FirstModelStates;
struct SaveVariant;
struct MoeShapes;

// A parameter's place in L.params, by name.
using ParamIndex = std::map<std::string, size_t>;
// (pp, tp, group) -> the group's parameters in flat order, each with its TP-local numel.
using GroupParams = std::map<std::tuple<int, int, int>, std::vector<std::pair<std::string, int64_t>>>;

// A parameter's shape, checked (pt::CheckedNumel).
std::vector<int64_t> Shape(const pt::Value& v);

// Whether a model-states file lists param_shapes (None: a save that records none).
bool HasParamShapes(const pt::Value& model_states_root);

// Parameter `name` has `shape` in file f (at its pp, tp): recorded, the first time with `group`;
// a different shape at the same tp is a problem ("... but <other shape> <elsewhere>").
source::ParamRecord& RecordShape(source::SourceIndex& L, ParamIndex& index, const std::string& name, int group,
                                 const source::ShardFile& f, const std::vector<int64_t>& shape, const char* elsewhere);

// Every parameter and its per-TP shape, from wherever this variant of save keeps them (and, without
// ZeRO in DeepSpeed's DDP bf16 wrapper, the optimizer state with them). Sets
// save.shapes_from_weights. False when the save lists no parameters in a form ucp knows (an error
// says so): the index stops there.
bool ReadParameters(source::SourceIndex& L, const FirstModelStates& first,
                    const std::vector<source::ShardFile*>& model_files, const ParseFile& parse, SaveVariant& save,
                    ParamIndex& index, GroupParams& group_params, MoeShapes& moe_shapes);

}  // namespace ucp::deepspeed
