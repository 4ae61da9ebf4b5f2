// The model's weights as its state_dict holds them: a pipeline's layer files, a plain module, or
// ZeRO-3's empty placeholders; a module that is no GPT with its buffers.
#include "formats/deepspeed/writer_files.h"

#include <map>
#include <memory>
#include <set>

#include "formats/deepspeed/names.h"
#include "formats/deepspeed/writer_values.h"

namespace ucp::deepspeed {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using reshard::Atom;
using reshard::Naming;

namespace {

// A module that is no GPT (Naming::Module) keeps its buffers in its state_dict beside the
// parameters (DeepSpeed's buffer_names), loaded with them: carried from the source's module, in
// its order. Megatron's GPT modules save none.
ValuePtr WithModuleBuffers(const TargetUnit& u, ValuePtr params) {
  if (u.S.naming != Naming::Module) return params;
  auto source = u.S.model_states.root->Get("module");
  auto buffers = u.S.model_states.root->Get("buffer_names");
  if (!source || source->kind != Value::Kind::Dict || !buffers || !buffers->IsSequence() || buffers->AsSequence().empty())
    return params;
  std::set<std::string> is_buffer;
  for (const auto& b : buffers->AsSequence())
    if (b->kind == Value::Kind::Str) is_buffer.insert(b->s);
  auto module = OrderedDict();
  for (const auto& item : source->dict.items()) {
    const std::string key = item.key->kind == Value::Kind::Str ? item.key->s : "";
    if (is_buffer.count(key)) module->dict.Set(item.key, item.value);
    else if (auto p = params->Get(key)) module->dict.Set(item.key, p);
  }
  return module;
}

}  // namespace

void WriteLayerFiles(const TargetUnit& u, const UnitWeights& weights, ShardFiles& files) {
  std::map<int, ValuePtr> layers;  // spec -> OrderedDict
  for (size_t k : u.ModelOrder()) {
    const Atom& a = u.S.atoms[u.U.params[k].atom];
    if (a.tied() && u.U.pp != u.P.embedding_stage) continue;  // the tied head writes no layer file
    auto& f = layers[a.spec()];
    if (!f) f = OrderedDict();
    SetItem(*f, a.place.local, weights.TrainingDtypeTensor(k));
  }
  for (const auto& [spec, dict] : layers) files.Write(LayerStatesFileName(spec, u.U.tp), *dict);
}

ValuePtr PlainModule(const TargetUnit& u, const UnitWeights& weights) {
  auto module = OrderedDict();
  for (size_t k : u.ModelOrder()) {
    if (u.S.atoms[u.U.params[k].atom].expert >= 0) continue;  // the experts have files of their own
    SetItem(*module, u.P.names[u.U.params[k].atom], weights.TrainingDtypeTensor(k));
  }
  return WithModuleBuffers(u, module);
}

ValuePtr Zero3Module(const TargetUnit& u) {
  static const auto placeholder_owner = std::make_shared<uint8_t>(0);
  const auto lp = LpOf(u.T.dtype);
  auto module = OrderedDict();
  for (size_t k : u.ModelOrder())
    SetItem(*module, u.P.names[u.U.params[k].atom], pt::OwnedTensor(placeholder_owner, placeholder_owner.get(), lp.dtype, {0}));
  return WithModuleBuffers(u, module);
}

}  // namespace ucp::deepspeed
