#include "formats/dcp/target.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "formats/dcp/dcp_files.h"
#include "formats/dcp/mesh.h"
#include "formats/dcp/metadata_writer.h"
#include "formats/hf/model.h"
#include "formats/hf/names.h"
#include "pt/torch_file.h"

namespace ucp::formats::dcp {
using pt::Value;
using pt::ValuePtr;
using reshard::ExportTensor;

namespace {

// A tensor of torchtitan's Llama: its fqn, where its rows come from, its optimizer group, its place
// in the model's state dict.
struct TitanTensor {
  std::string fqn;
  ExportTensor rows;
  int group = 0;
  int64_t order = 0;
};

// The Hugging Face target's tensors under torchtitan's names, q and k rows in torchtitan's order.
// Parameters under Hugging Face's own names (a Trainer or Accelerate job's): not translated yet.
void RefuseOwnNames(const std::vector<std::string>& names, const std::string& dir) {
  if (names.empty() || hf::TranslatedNaming(names)) return;
  throw Error(dir + ": the parameters carry Hugging Face's own names ('" + names.front() + "', ...: a Hugging Face Trainer "
              "or Accelerate job's): --format dcp writes torchtitan's Llama from Megatron-DeepSpeed's, Megatron-Core's or "
              "torchtitan's names, and a Trainer checkpoint is not a DCP source yet; --format hf writes its model");
}

std::vector<TitanTensor> TitanTensors(const reshard::Source& S, const reshard::ExportOptions& o, const Mesh& mesh,
                                      std::vector<std::string>& notes) {
  const std::string dir = S.reader->dir();
  std::vector<std::string> names;
  for (const auto& a : S.atoms) names.push_back(a.name);
  RefuseOwnNames(names, dir);
  for (const std::string& name : names)  // GPT-2's learned positions: GPT2LMHeadModel, no torchtitan model
    if (name.ends_with("position_embeddings.weight"))
      throw Error(dir + ": '" + name + "': a GPT-shaped model (learned positions): --format dcp writes torchtitan's Llama, which has "
                  "rotary embeddings; --format hf writes this model as GPT2LMHeadModel");
  const hf::LlamaFacts m = [&] {
    try {
      return hf::LlamaFactsOf(S, o, notes);
    } catch (const Error& e) {  // its terms are LlamaForCausalLM's: torchtitan's Llama is the same model
      throw Error(std::string("--format dcp writes torchtitan's Llama, the model --format hf writes as LlamaForCausalLM: ") + e.what());
    }
  }();
  if (m.tied)
    throw Error(dir + ": the output layer is the word embedding (tied): torchtitan's Llama has an output.weight of its own");
  if (m.experts > 0)
    throw Error(dir + ": a Mixture-of-Experts model (" + std::to_string(m.experts) + " experts per layer): --format dcp writes torchtitan's "
                "dense Llama; --format hf writes this model as MixtralForCausalLM");
  if (m.heads % mesh.tp != 0 || m.kv_heads % mesh.tp != 0) {  // its attention splits by heads; torch would cut rows anywhere
    const bool queries = m.heads % mesh.tp != 0, keys = m.kv_heads % mesh.tp != 0;
    throw Error("--mesh " + mesh.text() + ": tp=" + std::to_string(mesh.tp) + " does not divide the model's " +
                (queries ? std::to_string(m.heads) + " query heads" : "") + (queries && keys ? " and " : "") +
                (keys ? std::to_string(m.kv_heads) + " key-value heads" : "") +
                (queries && keys ? "" : " (" + (queries ? std::to_string(m.kv_heads) + " key-value" : std::to_string(m.heads) + " query") + " heads)") +
                ": torchtitan's tensor parallelism gives each rank whole heads");
  }
  char facts[256];
  std::snprintf(facts, sizeof facts, "dim %lld, n_layers %lld, n_heads %lld, n_kv_heads %lld, vocab_size %lld, feed-forward hidden size %lld, "
                "norm_eps %g, rope_theta %g", static_cast<long long>(m.hidden), static_cast<long long>(m.layers), static_cast<long long>(m.heads),
                static_cast<long long>(m.kv_heads), static_cast<long long>(m.vocab), static_cast<long long>(m.ffn), m.norm_eps, m.rope_theta);
  notes.push_back(std::string("torchtitan's Llama of this model: ") + facts + " (torchtitan derives the feed-forward size from dim, "
                  "multiple_of and ffn_dim_multiplier: choose them to give it)");
  std::vector<TitanTensor> out;
  for (ExportTensor t : hf::LlamaTensors(S, m)) {
    const auto titan = hf::TorchtitanName(t.name);
    if (!titan) throw Error(dir + ": parameter '" + t.source + "': its " + t.name + " has no place in torchtitan's Llama (no biases)");
    if (t.rotary_head_dim > 0)
      t.rotary_head_dim = 0;  // torchtitan's own rows (a torchtitan source): as they are
    else if (titan->rotary)
      t.rotary_head_dim = m.head_dim, t.rotary_to_pairs = true;  // Megatron's rotate-half to interleaved pairs
    out.push_back({titan->name, t, S.atoms.at(t.atom).group, titan->order});
  }
  std::stable_sort(out.begin(), out.end(), [](const TitanTensor& a, const TitanTensor& b) { return a.order < b.order; });
  return out;
}

// One key of the state dict: a tensor's box on each rank (none: a step or a bytes item, the same on
// every rank, carrying its torch.save file).
struct KeyItem {
  std::string key;
  ValuePtr path;  // planner_data
  ExportTensor data;
  std::vector<Box> boxes;
  bool bytes = false;
  Box on(int64_t rank) const { return boxes.empty() ? Box{} : boxes.at(rank); }
};

ValuePtr Path(std::vector<ValuePtr> parts) {
  auto t = Value::Make(Value::Kind::Tuple);
  t->items = std::move(parts);
  return t;
}

KeyItem TensorItem(const Mesh& mesh, const TitanTensor& t, const std::string& key, ValuePtr path, int state) {
  KeyItem it;
  it.key = key, it.path = std::move(path), it.data = t.rows;
  it.data.name = key, it.data.state = state;
  it.boxes = BoxesOf(mesh, t.fqn, t.rows.shape);
  return it;
}

KeyItem PayloadItem(const std::string& key, ValuePtr path, const Value& value, bool bytes) {
  KeyItem it;
  it.key = key, it.path = std::move(path);
  it.data.name = key, it.data.payload = pt::TorchFileBytes(value);
  it.bytes = bytes;
  return it;
}

// optim.state.<fqn>.step: the atomic tensor's step as torch's Adam keeps it (a 0-d float32 tensor).
KeyItem StepItem(const reshard::Source& S, const TitanTensor& t) {
  const std::string& name = S.atoms.at(t.rows.atom).name;
  if (!S.atoms.at(t.rows.atom).has_step) throw Error(S.reader->dir() + ": parameter '" + name + "' has no step");
  auto value = std::make_shared<float>(static_cast<float>(pt::StepValue(*S.reader->ReadStep(name))));
  auto tensor = pt::OwnedTensor(value, value.get(), pt::DType::F32, {});
  const std::string key = "optim.state." + t.fqn + ".step";
  return PayloadItem(key, Path({Value::Str("optim"), Value::Str("state"), Value::Str(t.fqn), Value::Str("step")}), *tensor, false);
}

// torch 2.6 AdamW's options past those every Adam has, with its defaults: a group saved without
// them (DeepSpeed's) gets them, since DCP's load asks for every key the model's optimizer has.
const std::vector<std::pair<std::string, ValuePtr>>& AdamDefaults() {
  static const std::vector<std::pair<std::string, ValuePtr>> d = {
      {"amsgrad", Value::Bool(false)}, {"foreach", Value::None()}, {"maximize", Value::Bool(false)},
      {"capturable", Value::Bool(false)}, {"differentiable", Value::Bool(false)}, {"fused", Value::None()}};
  return d;
}

// Whether a param group is Megatron's of wd_mult 0, whose weight_decay its scheduler sets to 0 at every step.
bool UndecayedGroup(const Value& group) {
  const ValuePtr wd_mult = group.Get("wd_mult");
  return wd_mult && (wd_mult->kind == Value::Kind::Float || wd_mult->kind == Value::Kind::Int) && wd_mult->AsFloat() == 0;
}

// optim.param_groups.<g>.<option>: each group's options as saved (torch's defaults added), then
// `params`, the fqns of the group's tensors.
void ParamGroupItems(const reshard::Source& S, const std::vector<TitanTensor>& tensors, std::vector<KeyItem>& items) {
  const ValuePtr groups = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!groups || !groups->IsSequence()) throw Error(S.reader->dir() + "/zero/optimizer_state.pt: no param_groups list");
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const Value& group = *groups->items[g];
    std::vector<std::pair<std::string, ValuePtr>> options;
    // Megatron's scheduler sets a group's weight_decay to the schedule's times its wd_mult at every
    // step; torch's AdamW applies weight_decay as it stands: the group of wd_mult 0 (the biases and
    // norms) is written with weight_decay 0, as Megatron trains it, whether or not a step came after
    // the save's groups were made.
    const bool kept = UndecayedGroup(group);
    for (const auto& kv : group.AsDict().items())
      if (kv.key->kind == Value::Kind::Str && kv.key->s != "params")
        options.emplace_back(kv.key->s, kept && kv.key->s == "weight_decay" ? Value::Float(0.0) : kv.value);
    for (const auto& [name, value] : AdamDefaults())
      if (!group.Get(name)) options.emplace_back(name, value);
    auto params = Value::Make(Value::Kind::List);
    for (const TitanTensor& t : tensors)
      if (t.group == static_cast<int>(g)) params->items.push_back(Value::Str(t.fqn));
    options.emplace_back("params", params);
    for (const auto& [name, value] : options) {
      const std::string key = "optim.param_groups." + std::to_string(g) + "." + name;
      items.push_back(PayloadItem(key, Path({Value::Str("optim"), Value::Str("param_groups"), Value::Int(static_cast<int64_t>(g)), Value::Str(name)}), *value, true));
    }
  }
}

// What the written param groups hold, where there are several: an optimizer built with fewer groups
// (torchtitan builds one) does not keep them.
void GroupsNote(const reshard::Source& S, const std::vector<TitanTensor>& tensors, std::vector<std::string>& notes) {
  const ValuePtr groups = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!groups || !groups->IsSequence() || groups->items.size() < 2) return;
  std::string each;
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const auto n = std::count_if(tensors.begin(), tensors.end(), [&](const TitanTensor& t) { return t.group == static_cast<int>(g); });
    const ValuePtr wd = groups->items[g]->Get("weight_decay");
    const bool kept = UndecayedGroup(*groups->items[g]);
    char decay[48] = "";
    if (wd && (wd->kind == Value::Kind::Float || wd->kind == Value::Kind::Int))
      std::snprintf(decay, sizeof decay, ", weight_decay %g", kept ? 0.0 : wd->AsFloat());
    each += (g ? "; " : "") + std::string("group ") + std::to_string(g) + ": " + std::to_string(n) + " tensors" + decay;
  }
  notes.push_back(std::to_string(groups->items.size()) + " optimizer param groups, each listing its parameters (" + each +
                  "): build the optimizer with the same groups for their options to hold (an optimizer of one group, as "
                  "torchtitan builds, gives every parameter that group's options)");
}

// The state dict's keys in get_state_dict's order: the model's, then each parameter's step and
// moments, group by group, then the param groups.
std::vector<KeyItem> StateDictItems(const reshard::Source& S, const Mesh& mesh, const std::vector<TitanTensor>& tensors, bool optimizer) {
  std::vector<KeyItem> items;
  for (const TitanTensor& t : tensors)
    items.push_back(TensorItem(mesh, t, "model." + t.fqn, Path({Value::Str("model"), Value::Str(t.fqn)}), 0));
  if (!optimizer) return items;
  std::vector<const TitanTensor*> order;
  for (const TitanTensor& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const TitanTensor* a, const TitanTensor* b) { return a->group < b->group; });
  for (const TitanTensor* t : order) {
    items.push_back(StepItem(S, *t));
    for (int state : {1, 2}) {
      const std::string name = state == 1 ? "exp_avg" : "exp_avg_sq";
      items.push_back(TensorItem(mesh, *t, "optim.state." + t->fqn + "." + name,
                                 Path({Value::Str("optim"), Value::Str("state"), Value::Str(t->fqn), Value::Str(name)}), state));
    }
  }
  ParamGroupItems(S, tensors, items);
  return items;
}

// A write item: a key and its chunk's offsets (a bytes item's: none).
using WriteIndex = std::pair<std::string, std::vector<int64_t>>;

// DCP's size of an item (dedup_save_plans): a chunk's bytes, a bytes item (or an empty chunk) 1.
int64_t StorageSize(const KeyItem& it, const Box& box) {
  int64_t n = 4;
  for (int64_t d : box.sizes) n *= d;
  return it.bytes || n == 0 ? 1 : n;
}

// dedup_save_plans: every rank plans its items; an item several ranks plan (a step, a bytes item, a
// norm's chunk on a TP group's ranks) goes to the one with the fewest bytes planned so far (the
// lowest of equals), the items taken as rank 0's plan lists them, then rank 1's new ones, ...
std::map<WriteIndex, int> AssignOwners(const std::vector<KeyItem>& items, int64_t ranks) {
  std::vector<std::pair<WriteIndex, const KeyItem*>> order;
  std::map<WriteIndex, std::vector<int>> planned;
  for (int r = 0; r < ranks; ++r)
    for (const KeyItem& it : items) {
      WriteIndex w{it.key, it.on(r).offsets};
      auto [at, fresh] = planned.try_emplace(w);
      if (fresh) order.emplace_back(w, &it);
      at->second.push_back(r);
    }
  std::vector<int64_t> size(static_cast<size_t>(ranks), 0);
  std::map<WriteIndex, int> owner;
  for (const auto& [w, it] : order) {
    const std::vector<int>& rs = planned[w];
    int best = rs.front();
    for (int r : rs)
      if (size[r] < size[best]) best = r;
    owner[w] = best;
    size[best] += StorageSize(*it, it->on(best));
  }
  return owner;
}

// Rank r's file: the items it saves (owner), each's box of its tensor.
void LayFile(const std::vector<KeyItem>& items, const std::map<WriteIndex, int>& owner, int r, reshard::ExportPlan& P, SavedCheckpoint& c) {
  std::vector<PlannedItem> mine;
  for (const KeyItem& it : items) {
    const Box box = it.on(r);
    if (owner.at({it.key, box.offsets}) != r) continue;  // another rank saves it
    PlannedItem p{{it.key, it.bytes, it.data.shape, box.offsets, box.sizes, ""}, it.data};
    if (p.data.payload.empty()) p.data.box_offsets = box.offsets, p.data.box_sizes = box.sizes;
    mine.push_back(std::move(p));
  }
  LayDcpFile(r, "", std::move(mine), P, c);
}

}  // namespace

void CheckDcpSource(const source::SourceIndex& L, const reshard::ExportOptions&) {
  std::vector<std::string> names;
  for (const auto& p : L.params) names.push_back(p.name);
  RefuseOwnNames(names, L.root);
}

void CheckDcpOptions(const reshard::ExportOptions& o) { ParseMesh(o.mesh); }

reshard::ExportPlan PlanDcp(const reshard::Source& S, const reshard::ExportOptions& o) {
  const Mesh mesh = ParseMesh(o.mesh);
  if (!o.dtype.empty() && o.dtype != "fp32")
    throw Error("--dtype " + o.dtype + ": --format dcp writes fp32 (torchtitan's FSDP2 and tensor parallelism keep fp32 parameters and moments)");
  reshard::ExportPlan P;
  P.dtype = "fp32";
  P.model = "torchtitan Llama on " + mesh.text();
  const std::vector<TitanTensor> tensors = TitanTensors(S, o, mesh, P.notes);
  const bool optimizer = !S.manifest["source"].value("weights_only", false);
  if (!optimizer) P.notes.push_back("the atomic checkpoint holds weights only: the model's keys alone are written");
  P.notes.push_back(std::string("the layout is get_state_dict's ({\"model\": ...") + (optimizer ? ", \"optim\": ..." : "") +
                    "}): dcp.load into that dict of get_state_dict(model" + (optimizer ? ", optimizer" : "") + "), then set_state_dict, "
                    "loads it; torchtitan's CheckpointManager layout (its train_state, lr_scheduler and dataloader) is not written yet");
  if (optimizer) {
    reshard::RefuseUnknownGroups(S, "--format mcore and --format hf, whose jobs rebuild their groups, write this checkpoint");
    GroupsNote(S, tensors, P.notes);
  }
  std::vector<KeyItem> items = StateDictItems(S, mesh, tensors, optimizer);
  const std::map<WriteIndex, int> owner = AssignOwners(items, mesh.ranks());
  SavedCheckpoint c;
  for (const KeyItem& it : items) c.planner_data.emplace_back(it.key, it.path);
  for (int64_t r = 0; r < mesh.ranks(); ++r) LayFile(items, owner, static_cast<int>(r), P, c);
  c.checkpoint_id = std::filesystem::path(o.output).lexically_normal().filename().string();  // the folder's name
  if (c.checkpoint_id.empty()) c.checkpoint_id = std::filesystem::path(o.output).lexically_normal().parent_path().filename().string();
  c.save_id = SaveIdOf(S, mesh.text());
  P.marker = ".metadata";
  P.marker_text = MetadataPickle(c);
  return P;
}

}  // namespace ucp::formats::dcp
