// Another family's atomic checkpoint (Megatron-Core's, from a torch_dist or a legacy save; torchtitan's
// DCP) read as Megatron-DeepSpeed's GPTModel parameters, for a DeepSpeed target: the model the Hugging
// Face export describes (its config.json and tensors: model.h, names.h, gpt2.h, mixtral.h) imported back
// as a Hugging Face model is (import_model.h), each parameter's rows taken through both tables from the
// source's atoms: the fp32 weights and, where the source holds them, both Adam moments, each element
// moved, none computed. Its step and param groups are the source optimizer's (each Megatron-DeepSpeed
// group takes the options of the source group its parameters come from). One table per architecture and
// family serves every direction: nothing here names a tensor.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "core/error.h"
#include "formats/driver.h"
#include "formats/hf/import_model.h"
#include "formats/hf/import_states.h"
#include "layout/naming.h"
#include "layout/store_rows.h"
#include "pt/torch_file.h"
#include "source/source_index.h"
#include "store/atomic_store.h"

namespace ucp::formats {
namespace hf {
namespace {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;

struct AtomicSource {
  reshard::Source S;                 // the other family's atomic checkpoint
  reshard::ExportPlan hf;            // its tensors as Hugging Face's, in fp32
  ImportModel M;                     // Megatron-DeepSpeed's parameters, their rows from those tensors
  std::map<std::string, int> from;   // a tensor's name -> its index in hf.tensors
  std::unique_ptr<reshard::StoreRows> rows;
};

std::string ConfigText(const reshard::ExportPlan& P) {
  for (const auto& [name, text] : P.side_files)
    if (name == "config.json") return text;
  if (P.marker == "config.json") return P.marker_text;
  throw Error("internal: the Hugging Face export plan has no config.json");
}

// Where Megatron-Core did not save which parameter is in which group (a chain's groups, the experts'
// apart: every atom records group 0), each Megatron-DeepSpeed group's by its role, as Megatron's
// _get_param_groups makes them: the one source group of its is_expert_parallel (the experts') and
// wd_mult (1: weights of two or more dimensions, 0: biases and norms); nullopt where not exactly one.
std::optional<std::vector<int>> GroupsByRole(const AtomicSource& s, const Value& groups) {
  std::vector<int> of;
  for (int g = 0;; ++g) {
    bool any = false, expert = false, decayed = false;
    for (const ImportAtom& a : s.M.atoms)
      if (a.group == g) {
        any = true;
        expert = expert || reshard::ExpertOf(a.name).has_value();
        decayed = decayed || (a.shape.size() >= 2 && !a.name.ends_with(".bias"));
      }
    if (!any) break;
    int found = -1, matches = 0;
    for (size_t k = 0; k < groups.items.size(); ++k) {
      const Value& group = *groups.items[k];
      if (group.kind != Value::Kind::Dict) continue;
      const ValuePtr wd = group.Get("wd_mult"), ep = group.Get("is_expert_parallel");
      if (wd && wd->IsNumber() && wd->AsFloat() == (decayed ? 1.0 : 0.0) && (ep && ep->kind == Value::Kind::Bool ? ep->b : false) == expert)
        found = static_cast<int>(k), ++matches;
    }
    if (matches != 1) return std::nullopt;
    of.push_back(found);
  }
  return of;
}

// The source group each Megatron-DeepSpeed group takes its options from: the one its parameters' rows
// come from; groups whose parameters come from source groups of different options are refused, as are
// Megatron's groups whose members the source did not save and whose roles do not tell them
// (reshard::RefuseUnknownGroups).
std::vector<int> SourceGroups(const AtomicSource& s, const std::string& dir) {
  const ValuePtr groups = s.S.optimizer.root ? s.S.optimizer.root->Get("param_groups") : nullptr;
  const size_t count = groups && groups->kind == Value::Kind::List ? groups->items.size() : 0;
  auto options = [&](int g) {
    if (g < 0 || static_cast<size_t>(g) >= count || groups->items[static_cast<size_t>(g)]->kind != Value::Kind::Dict)
      throw Error(dir + "/zero/optimizer_state.pt: no param group " + std::to_string(g) + ", which parameters are in");
    return pt::PickleData(*reshard::GroupOptions(*groups->items[static_cast<size_t>(g)]));
  };
  try {
    reshard::RefuseUnknownGroups(s.S, "--format mcore and --format hf, whose jobs rebuild their groups, write this checkpoint");
  } catch (const Error&) {
    if (auto by_role = GroupsByRole(s, *groups)) return *by_role;
    throw;
  }
  std::vector<int> of;             // per Megatron-DeepSpeed group
  std::vector<std::string> first;  // per Megatron-DeepSpeed group: the parameter that chose it, for messages
  for (const ImportAtom& a : s.M.atoms) {
    if (static_cast<size_t>(a.group) >= of.size()) of.resize(static_cast<size_t>(a.group) + 1, -1), first.resize(of.size());
    for (int f : a.fills) {
      const reshard::ExportTensor& t = s.hf.tensors[static_cast<size_t>(s.from.at(s.M.tensors[static_cast<size_t>(f)].name))];
      const reshard::Atom& src = s.S.atoms.at(static_cast<size_t>(t.atom));
      int& g = of[static_cast<size_t>(a.group)];
      if (g < 0) {
        options(src.group);  // (there)
        g = src.group, first[static_cast<size_t>(a.group)] = src.name;
      } else if (g != src.group && options(g) != options(src.group)) {
        throw Error(dir + ": '" + src.name + "' (optimizer group " + std::to_string(src.group) + ") and '" +
                    first[static_cast<size_t>(a.group)] + "' (group " + std::to_string(g) + ") have different optimizer options, "
                    "but Megatron-DeepSpeed's GPTModel puts their parameters in one group (" + a.name + ")");
      }
    }
  }
  for (size_t g = 0; g < of.size(); ++g)
    if (of[g] < 0) throw Error(dir + ": Megatron-DeepSpeed's optimizer group " + std::to_string(g) + " would hold no parameter");
  return of;
}

// zero/optimizer_state.pt of the Megatron-DeepSpeed parameters: each group the options of its source
// group (as Megatron saved them: wd_mult and lr_mult, which Megatron-DeepSpeed's scheduler reads too),
// `params` its position, as torch's state_dict lists it.
ValuePtr OptimizerState(const AtomicSource& s, const std::vector<int>& source_group) {
  auto list = Value::Make(Value::Kind::List);
  auto groups = s.S.optimizer.root->Get("param_groups");
  for (size_t g = 0; g < source_group.size(); ++g) {
    ValuePtr group = reshard::GroupOptions(*groups->items[static_cast<size_t>(source_group[g])]);
    SetItem(*group, "params", pt::IntList({static_cast<int64_t>(g)}));
    // DeepSpeed's expert groups (split_params_into_different_moe_groups_for_optimizer): 'moe' and the
    // expert-parallel group's name, which the writer sets to the target's 'ep_size_<ep>'.
    if (std::any_of(s.M.atoms.begin(), s.M.atoms.end(), [&](const ImportAtom& a) { return a.group == static_cast<int>(g) && reshard::ExpertOf(a.name); })) {
      SetItem(*group, "name", Value::Str("ep_size_1"));
      SetItem(*group, "moe", Value::Bool(true));
    }
    list->items.push_back(group);
  }
  auto root = Value::Make(Value::Kind::Dict);
  SetItem(*root, "param_groups", list);
  return root;
}

source::SourceIndex IndexAtomic(const std::string& dir, const source::IndexOptions& options) {
  auto s = std::make_shared<AtomicSource>();
  s->S = reshard::LoadAtomic(dir);
  const nlohmann::json& src = s->S.manifest.at("source");
  const std::string framework = src.value("framework", std::string("?"));
  if (!reshard::GlobalTensorsFramework(framework))
    throw Error(dir + ": converted from a " + framework + " checkpoint, whose parameters carry Megatron-DeepSpeed's or their own "
                "names already");
  reshard::ExportOptions fp32;
  fp32.dtype = "fp32";
  if (!options.model_config_path.empty()) {  // (read and checked to be a JSON object by ucp-reshard's command line)
    fp32.model_config = nlohmann::json::parse(options.model_config_text);
    fp32.model_config_path = options.model_config_path, fp32.model_config_text = options.model_config_text;
  }
  s->hf = HuggingFaceTarget().plan_export(s->S, fp32);
  HfConfig c;
  try {
    c = ParseHfConfig(ConfigText(s->hf), dir + " (its model as a Hugging Face config.json)");
    s->M = ImportModelOf(c, dir);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + ": Megatron-DeepSpeed's GPTModel does not hold this model as it is, so no "
                "DeepSpeed layout is written; --format mcore and --format hf write it");
  }
  for (size_t i = 0; i < s->hf.tensors.size(); ++i) s->from[s->hf.tensors[i].name] = static_cast<int>(i);
  for (const auto& t : s->M.tensors) {
    auto it = s->from.find(t.name);
    if (it == s->from.end() || s->hf.tensors[static_cast<size_t>(it->second)].shape != t.shape)
      throw Error(dir + ": its model as " + c.architecture + " has no tensor '" + t.name + "' of shape " + pt::ShapeString(t.shape) +
                  ", which Megatron-DeepSpeed's parameters take rows from");
  }
  s->rows = std::make_unique<reshard::StoreRows>(s->S);

  source::SourceIndex L;
  L.format = "atomic", L.root = dir, L.dir = dir, L.framework = "megatron-deepspeed", L.naming = "plain";
  L.dtype = src.value("dtype", std::string("fp32"));
  L.iteration = src.value("iteration", int64_t{0});
  L.tag = "global_step" + std::to_string(L.iteration);
  L.moe = c.llama.experts > 0, L.ep = 1;
  L.optimizer = s->S.weights_only || options.weights_only ? "none" : "torch";
  for (const auto& a : s->M.atoms) {
    source::ParamRecord p;
    p.name = a.name, p.group = a.group, p.tp_shape[0] = a.shape, p.stages = {0};
    if (auto e = reshard::ExpertOf(a.name)) p.expert = static_cast<int>(e->id), p.ep_rank = 0;
    L.params.push_back(p);
  }
  L.model_states = ImportModelStates(c, s->M, L.dtype);
  for (const char* key : {"iteration", "global_steps"}) SetItem(*L.model_states, key, Value::Int(L.iteration));
  if (auto args = L.model_states->Get("args"); args && args->state) {
    SetItem(*args->state, "iteration", Value::Int(L.iteration));
    // What the source job's Megatron args say of the run (Megatron-LM's; torchtitan saves none): its data
    // position and batch, sequence and tokenizer, which Megatron-DeepSpeed resumes from or checks.
    for (const char* key : {"seq_length", "consumed_train_samples", "consumed_valid_samples", "micro_batch_size", "global_batch_size",
                            "tokenizer_type", "train_iters"})
      if (const Value* v = reshard::ArgOf(s->S, key)) SetItem(*args->state, key, std::make_shared<Value>(*v));  // (None too: it is checked by name)
    // The job's vocabulary divisor where its args say it (a Megatron-LM job's): the same padding at any TP.
    if (s->S.divisible_by > 0) {
      const int64_t by = s->S.divisible_by, vocab = args->state->Get("vocab_size")->AsInt();
      SetItem(*args->state, "make_vocab_size_divisible_by", Value::Int(by));
      SetItem(*args->state, "padded_vocab_size", Value::Int((vocab + by - 1) / by * by));
    }
  }
  L.universal_checkpoint_info = L.model_states->Get("universal_checkpoint_info");
  L.args = L.model_states->Get("args");
  source::TakeMegatronArgs(L.args.get(), L);
  if (!s->S.weights_only && !options.weights_only) {
    const std::vector<int> groups = SourceGroups(*s, dir);
    L.optimizer_state = OptimizerState(*s, groups);
    const ValuePtr step = reshard::CommonStep(s->S, "Megatron-DeepSpeed's parameters here would be at different steps");
    for (size_t g = 0; g < groups.size(); ++g) L.steps[{0, 0, static_cast<int>(g)}] = step;
  }
  for (const auto* notes : {&s->hf.notes, &c.notes})
    for (const std::string& n : *notes) L.notes.push_back(n);
  L.notes.push_back(dir + ": " + framework + "'s " + std::to_string(s->S.atoms.size()) + " parameters as " + c.architecture + " (" +
                    std::to_string(s->M.tensors.size()) + " tensors), then as " + std::to_string(L.params.size()) +
                    " Megatron-DeepSpeed parameters" + (L.optimizer_state ? ", with their Adam moments and step" : ", weights only"));
  L.keep_alive = s;
  return L;
}

void ReadState(const source::SourceIndex& L, int param, int state, float* dst) {
  const auto& s = *std::static_pointer_cast<const AtomicSource>(L.keep_alive);
  FillAtom(s.M, static_cast<size_t>(param), [&](const reshard::ExportTensor& t, float* buf) {
    reshard::ExportTensor at = s.hf.tensors[static_cast<size_t>(s.from.at(t.name))];
    at.state = state;
    reshard::ReadWholeTensor(*s.rows, at, buf);
  }, dst);
}

void ReadWeights(const source::SourceIndex& L, int param, float* dst) { ReadState(L, param, 0, dst); }

}  // namespace
}  // namespace hf

const SourceDriver& AtomicAsDeepSpeedSource() {
  static constexpr SourceDriver driver = {"atomic",
     "an atomic checkpoint of Megatron-Core or torchtitan read as Megatron-DeepSpeed's GPTModel parameters (through the "
     "Hugging Face export's and import's tables), its Adam moments and step with them",
     "ucp_manifest.json", store::IsAtomicCheckpoint, hf::IndexAtomic, hf::ReadWeights, nullptr, hf::ReadState};
  return driver;
}

}  // namespace ucp::formats
