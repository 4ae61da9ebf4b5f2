#include "formats/dcp/megatron_core.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/format.h"
#include "formats/dcp/bucket_layout.h"
#include "pt/torch_file.h"

namespace ucp::formats::dcp {

namespace fs = std::filesystem;
using pt::Value;

bool IsMegatronCore(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "metadata.json", ec);  // torch's own writer never makes one
}

namespace {

std::string Backend(const std::string& dir) {
  const std::string path = dir + "/metadata.json";
  return WithContext(path, [&] {
    std::ifstream in(path);
    if (!in) throw Error("cannot be read");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw Error("not a JSON object (Megatron-Core's dist_checkpointing writes its backends there)");
    auto word = [&](const char* key) {
      auto it = j.find(key);
      return it == j.end() ? std::string("?") : it->is_string() ? it->get<std::string>() : it->dump();
    };
    const std::string sharded = word("sharded_backend");
    if (sharded != "torch_dist")
      throw Error("sharded_backend '" + sharded + "': ucp reads Megatron-Core's torch_dist checkpoints (saved through "
                  "PyTorch DCP); other backends (zarr, ...) are not supported");
    // The releases whose files were read here write version 1 of both; another is refused, not guessed at.
    for (const auto& [key, want] : {std::pair<const char*, const char*>{"sharded_backend_version", "1"},
                                    {"common_backend", "torch"}, {"common_backend_version", "1"}})
      if (word(key) != want)
        throw Error(std::string(key) + " " + word(key) + ": ucp reads " + key + " " + want + " (Megatron-Core's torch_dist as "
                    "its releases up to 0.17 write it)");
    return "sharded_backend torch_dist " + word("sharded_backend_version") + ", common_backend " + word("common_backend") +
           " " + word("common_backend_version");
  });
}

// One Megatron optimizer's common state: its param groups (appended to `groups`) and step (to mc.steps).
// Returns false for the distributed optimizer's dp_reshardable form, whose groups are in the DCP.
bool ReadOneOptimizer(const pt::ValuePtr& optimizer, MegatronCore& mc, std::vector<pt::ValuePtr>& groups) {
  // The distributed optimizer's state_dict nests its torch state under `optimizer` beside the form
  // of its per-parameter state; a plain Megatron optimizer's is torch's, with a common step.
  pt::ValuePtr torch_state = optimizer;
  if (auto form = optimizer->Get("param_state_sharding_type")) {
    mc.optimizer_form = "DistributedOptimizer, " + form->AsStr();
    if (form->AsStr() == "dp_reshardable") return false;  // its param groups and step are saved per domain, in the DCP
    if (form->AsStr() != "fully_reshardable")
      throw Error("the distributed optimizer's state is in its '" + form->AsStr() + "' form: ucp reads the fully_reshardable "
                  "form (Megatron-LM --dist-ckpt-optim-fully-reshardable), whose state is per parameter, and the "
                  "dp_reshardable form (Megatron-LM's default), whose state is laid out by the gradient buckets");
    torch_state = optimizer->Get("optimizer");
    if (!torch_state) throw Error("optimizer.param_state_sharding_type without optimizer.optimizer");
  } else if (auto inner = optimizer->Get("optimizer");
             !optimizer->Get("param_groups") && inner && inner->Get("param_groups") && optimizer->kind == Value::Kind::Dict &&
             optimizer->AsDict().size() == 1) {
    torch_state = inner;  // the mixed-precision optimizer's (Float16OptimizerWithFloat16Params): torch's state one level down
    mc.optimizer_form = "mixed precision (fp32 masters as optimizer.state.fp32_param)";
  } else if (!optimizer->Get("param_groups")) {
    const std::string keys = optimizer->kind != Value::Kind::Dict ? optimizer->TypeName()
                             : JoinNames(optimizer->AsDict().items(), ", ", [](const auto& it) { return pt::ScalarKey(*it.key); });
    throw Error("optimizer holds " + keys + ", not param_groups: not a Megatron optimizer's state ucp knows");
  }
  auto saved = torch_state->Get("param_groups");
  if (!saved || !saved->IsSequence()) throw Error("optimizer.param_groups is " + (saved ? saved->TypeName() : std::string("absent")) + ", not a list");
  groups.insert(groups.end(), saved->items.begin(), saved->items.end());
  if (auto state = torch_state->Get("state"); state && state->Get("common_step")) mc.steps.push_back(state->Get("common_step"));
  else  // the distributed optimizer keeps the step in each param group
    for (const auto& g : saved->items)
      if (auto step = g ? g->Get("step") : nullptr) mc.steps.push_back(step);
  return true;
}

// A ChainedOptimizer's common state (Megatron-LM's dense and expert optimizers at EP > 1): {index: each one's}.
bool Chained(const Value& optimizer) {
  if (optimizer.kind != Value::Kind::Dict || optimizer.AsDict().size() < 2) return false;
  for (const auto& it : optimizer.AsDict().items())
    if (!it.key || it.key->kind != Value::Kind::Int) return false;
  return true;
}

}  // namespace

MegatronCore ReadMegatronCore(const std::string& dir) {
  MegatronCore mc;
  mc.backend = Backend(dir);
  const std::string path = dir + "/common.pt";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(dir + ": no common.pt beside metadata.json (Megatron-Core 0.19 and later keep the common state inside "
                "the DCP as common_state, which ucp does not read yet)");
  pt::ReadOptions options;
  options.verify_storage_crc = true;  // small: its step tensor is read here
  const pt::TorchFile common = pt::ReadTorchFile(path, options);
  WithContext(path, [&] {
    if (!common.root || common.root->kind != Value::Kind::Dict) throw Error("holds a " + (common.root ? common.root->TypeName() : "null") + ", not a dict");
    for (const auto& it : common.root->AsDict().items())
      if (it.key && it.key->kind == Value::Kind::Str) mc.common_keys.push_back(it.key->s);
    if (auto it = common.root->Get("iteration")) mc.iteration = it->AsInt(), mc.has_iteration = true;
    mc.args = common.root->Get("args");
    auto optimizer = common.root->Get("optimizer");
    if (!optimizer) return;
    std::vector<pt::ValuePtr> groups;
    if (Chained(*optimizer)) {  // each optimizer's groups in the chain's order (dense, then expert), one list
      std::vector<std::pair<int64_t, pt::ValuePtr>> parts;
      for (const auto& it : optimizer->AsDict().items()) parts.emplace_back(it.key->i, it.value);
      std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      size_t in_buckets = 0;
      for (const auto& entry : parts) {  // (not a structured binding: a lambda below uses it, which clang 14 refuses)
        const int64_t index = entry.first;
        const pt::ValuePtr& part = entry.second;
        if (!part || part->kind != Value::Kind::Dict) throw Error("optimizer[" + std::to_string(index) + "] is not a dict");
        const size_t before = groups.size();
        if (WithContext("optimizer[" + std::to_string(index) + "] of a ChainedOptimizer", [&] { return ReadOneOptimizer(part, mc, groups); }))
          mc.chained.push_back(static_cast<int64_t>(groups.size() - before));
        else
          ++in_buckets;  // its param groups are in the DCP, per domain: counted there
      }
      mc.optimizer_form = "ChainedOptimizer of " + std::to_string(parts.size()) + " (" + mc.optimizer_form + ")";
      if (in_buckets == parts.size()) {  // Megatron-LM's default at EP > 1: each optimizer's state in its buckets
        mc.chained.clear(), mc.bucket_flat = true, mc.chain_parts = static_cast<int>(parts.size());
        return;
      }
      if (in_buckets > 0) throw Error("a ChainedOptimizer of which some optimizers are in the dp_reshardable form and some not: not one save's");
    } else if (!ReadOneOptimizer(optimizer, mc, groups)) {
      mc.bucket_flat = true;
      return;
    }
    auto list = Value::Make(Value::Kind::List);
    list->items = std::move(groups);
    mc.param_groups = list;
  });
  mc.file.name = "common.pt", mc.file.kind = "megatron_common", mc.file.carried = true;
  for (const auto& [name, e] : common.archive->entries()) mc.file.checksummed.push_back({name, e.data_offset, e.size, e.crc32});
  std::sort(mc.file.checksummed.begin(), mc.file.checksummed.end(),
            [](const source::ChecksummedRange& a, const source::ChecksummedRange& b) { return a.offset < b.offset; });
  return mc;
}

MegatronKey MegatronKeyOf(const std::string& key, bool tensor) {
  MegatronKey k;
  static const std::string state = "optimizer.state.";
  if (key.rfind(state, 0) == 0) {
    const size_t dot = key.find('.', state.size());
    if (dot == std::string::npos || dot == state.size() || dot + 1 == key.size()) {
      if (tensor) k.kind = MegatronKey::Unread;
      return k;
    }
    k.kind = MegatronKey::OptimizerState, k.state = key.substr(state.size(), dot - state.size()), k.fqn = key.substr(dot + 1);
  } else if (DistributedOptimizerKey(key)) {
    k.kind = MegatronKey::BucketFlat;
  } else if (tensor && (key.rfind("optimizer.", 0) == 0 || (key.rfind("chained_", 0) == 0 && key.find(".optimizer.") != std::string::npos))) {
    k.kind = MegatronKey::Unread;  // optimizer state of a form not known here: never read as a model tensor
  } else if (tensor) {
    k.kind = MegatronKey::Model, k.fqn = key;
  }
  return k;
}

}  // namespace ucp::formats::dcp
