// The source of a reshard: an atomic checkpoint loaded as reshard_plan.h's `Source`: its manifest,
// carried model-states and args files, optimizer state and atoms; the naming of its parameters
// (GPTModelPipe, GPTModel, or a plain engine's own module), its layer count, Mixture-of-Experts
// facts and ZeRO-3 param groups, each checked against the files that record them.
#include "layout/reshard_plan.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/names.h"
#include "pt/value.h"

namespace ucp::reshard {
using nlohmann::json;
using patterns::Pattern;
using pt::Value;

namespace {

Pattern PatternFromName(const std::string& s) {
  for (Pattern p : {Pattern::Unique, Pattern::Replicate, Pattern::Partial, Pattern::ShardV, Pattern::ShardH, Pattern::ShardNC})
    if (patterns::PatternName(p) == s) return p;
  throw Error("unknown pattern '" + s + "' in the manifest");
}

// Mixture of Experts: each expert parameter's global id and MoE layer ordinal (the MoE layers in
// model order, as DeepSpeed numbers them), checked against the model-states file's num_experts;
// which optimizer groups hold experts.
void ReadExperts(Source& S, const std::string& model_path) {
  S.moe = true;
  S.ep = S.manifest["source"].value("ep", 1);
  auto n = S.model_states.root->Get("num_experts");
  if (!n || n->kind != Value::Kind::List) throw Error(model_path + ": a Mixture-of-Experts model-states file without num_experts");
  for (const auto& c : n->AsSequence()) S.num_experts.push_back(c->AsInt());
  std::map<std::pair<int, std::string>, std::set<int>> layers;  // (spec, expert prefix) -> global ids
  std::vector<std::string> prefix(S.atoms.size());                 // per atom: its expert prefix, if any
  for (size_t k = 0; k < S.atoms.size(); ++k)
    if (auto e = ExpertOf(S.atoms[k].name); e && S.atoms[k].name.find(".deepspeed_moe.") != std::string::npos) {
      S.atoms[k].expert = e->id, prefix[k] = e->prefix;
      layers[{S.atoms[k].spec(), e->prefix}].insert(e->id);
    }
  if (layers.size() != S.num_experts.size())
    throw Error(model_path + ": num_experts lists " + std::to_string(S.num_experts.size()) + " MoE layers but the atomic "
                "checkpoint holds experts of " + std::to_string(layers.size()));
  std::map<std::string, int> ordinal;
  for (const auto& [key, ids] : layers) {
    const int layer = static_cast<int>(ordinal.size());
    const int64_t want = S.num_experts[layer];
    if (static_cast<int64_t>(ids.size()) != want || *ids.rbegin() != want - 1)
      throw Error("'" + key.second + "' (MoE layer " + std::to_string(layer) + "): the atomic checkpoint holds " +
                  std::to_string(ids.size()) + " experts, num_experts says " + std::to_string(want));
    ordinal[key.second] = layer;
  }
  int groups = 0;
  for (const Atom& a : S.atoms) groups = std::max(groups, a.group + 1);
  std::vector<int> experts(groups, 0), others(groups, 0);
  for (size_t k = 0; k < S.atoms.size(); ++k) {
    Atom& a = S.atoms[k];
    if (a.expert >= 0) a.moe_layer = ordinal.at(prefix[k]);
    (a.expert >= 0 ? experts : others)[a.group]++;
  }
  for (int g = 0; g < groups; ++g) {
    if (experts[g] > 0 && others[g] > 0)
      throw Error("optimizer group " + std::to_string(g) + " holds experts and other parameters: DeepSpeed keeps experts "
                  "in groups of their own (split_params_into_different_moe_groups_for_optimizer)");
    S.expert_group.push_back(experts[g] > 0);
  }
}

}  // namespace

int EpRankOf(const Source& S, const Atom& a, int ep) {
  return a.expert / static_cast<int>(S.num_experts.at(a.moe_layer) / ep);
}

int LocalExpertId(const Source& S, const Atom& a, int ep) {
  return a.expert % static_cast<int>(S.num_experts.at(a.moe_layer) / ep);
}

namespace {

// ZeRO-3 cuts a param group into sub-groups (stage3.py's _create_fp16_sub_groups, by the job's
// sub_group_size), each a flat partition of its own, numbered across the groups: the atoms' `group`
// counts them, and the optimizer's param_groups list each group's. The atoms go to their param
// group: a target's ZeRO-1/2 holds one flat partition per group, its ZeRO-3 cuts them again by its
// own sub_group_size (the writer).
void PlaceInParamGroups(Source& S, const std::string& dir) {
  auto groups = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!groups || !groups->IsSequence()) return;
  std::map<int64_t, int> group_of;  // flat partition (sub-group) -> param group
  const auto& list = groups->AsSequence();
  for (size_t g = 0; g < list.size(); ++g) {
    auto params = list[g]->kind == Value::Kind::Dict ? list[g]->Get("params") : nullptr;
    if (!params || !params->IsSequence()) return;
    for (const auto& p : params->AsSequence())
      if (p->kind == Value::Kind::Int) group_of[p->AsInt()] = static_cast<int>(g);
  }
  if (group_of.size() <= list.size()) return;  // one flat partition per group: nothing to place
  for (Atom& a : S.atoms) {
    auto it = group_of.find(a.group);
    if (it == group_of.end())
      throw Error(dir + "/zero/optimizer_state.pt: no param group lists ZeRO-3 sub-group " + std::to_string(a.group) +
                  " of parameter '" + a.name + "'");
    a.group = it->second;
  }
}

}  // namespace

const Value* ArgOf(const Source& S, const char* key) {
  const pt::TorchFile& from = S.model_states.root ? S.model_states : S.args_file;
  auto args = from.root ? from.root->Get("args") : nullptr;
  auto v = args ? args->Get(key) : nullptr;
  return v ? v.get() : nullptr;
}

Source LoadAtomic(const std::string& dir, bool optimizer) {
  Source S;
  S.reader = store::AtomReader::Open(dir);
  S.manifest = S.reader->manifest();
  // The carried model-states file of rank 0 (none: a source DeepSpeed cannot resume, whose tensors
  // serve a model export only; LoadSource, for a training layout, requires the file).
  const std::string model_file = store::CarriedModelStates(S.manifest);
  if (!model_file.empty()) RequirePlainName(model_file, dir + "/ucp_manifest.json: source.model_states");
  if (S.manifest["source"].value("moe", false) && S.manifest["source"].value("model_states", "").empty())
    throw Error(dir + ": a Mixture-of-Experts atomic checkpoint whose manifest does not name its model-states file "
                "(written by an earlier ucp-convert): convert the checkpoint again");
  S.model_file = model_file;
  if (!model_file.empty()) S.model_states = S.reader->ReadCheckedFile(model_file);
  if (std::string args = S.manifest["source"].value("args_file", ""); !args.empty()) {
    RequirePlainName(args, dir + "/ucp_manifest.json: source.args_file");
    S.args_file = S.reader->ReadCheckedFile(args), S.args_file_name = args;
  }
  S.weights_only = S.reader->weights_only();
  if (!S.weights_only && optimizer) S.optimizer = S.reader->ReadCheckedFile("zero/optimizer_state.pt");
  S.tp = S.manifest["source"].value("tp", 1);
  if (const Value* d = ArgOf(S, "make_vocab_size_divisible_by")) S.divisible_by = d->AsInt();
  auto info = S.model_states.root ? S.model_states.root->Get("universal_checkpoint_info") : nullptr;
  if (info && info->Get("original_vocab_size")) S.vocab = info->At("original_vocab_size").AsInt();
  if (info && info->Get("padded_vocab_size")) S.padded_vocab = info->At("padded_vocab_size").AsInt();
  for (const store::AtomParam& p : S.reader->params()) {
    Atom a;
    static_cast<store::AtomParam&>(a) = p;
    a.model_pattern = PatternFromName(p.pattern);
    if (a.vocab && S.vocab == 0) S.vocab = a.shape[0];
    S.atoms.push_back(std::move(a));
  }
  if (S.manifest["source"].value("zero_stage", 0) == 3 && S.optimizer.root) PlaceInParamGroups(S, dir);
  return S;
}

namespace {

// A plain engine around another model (Naming::Module): every atom keeps its name, at its place in
// the module's state_dict. The module lists every parameter (under ZeRO-3 as an empty placeholder);
// one it lacks is not this model's.
void PlaceInModule(Source& S, const std::string& model_path) {
  S.naming = Naming::Module;
  std::map<std::string, int> order;
  if (auto module = S.model_states.root->Get("module"); module && module->kind == Value::Kind::Dict)
    for (const auto& item : module->dict.items())
      if (item.key->kind == Value::Kind::Str) order.emplace(item.key->s, static_cast<int>(order.size()));
  for (Atom& a : S.atoms) {
    a.place = PlaceOf(a.name, Naming::Module, 0);
    auto it = order.find(a.name);
    if (it == order.end())
      throw Error(model_path + ": the module holds no parameter '" + a.name + "', which the atomic checkpoint holds: "
                  "the model-states file is not this model's");
    a.module_order = it->second;
    order.erase(it);
  }
  // What is left is a buffer (buffer_names) or a parameter no optimizer holds: frozen (a LoRA model's
  // base weights), whose values the atomic checkpoint does not keep. Refused, never left out unsaid.
  if (auto buffers = S.model_states.root->Get("buffer_names"); buffers && buffers->IsSequence())
    for (const auto& b : buffers->AsSequence())
      if (b->kind == Value::Kind::Str) order.erase(b->s);
  if (!order.empty())
    throw Error(model_path + ": the module holds " + std::to_string(order.size()) + " parameter(s) no optimizer state "
                "covers, e.g. '" + order.begin()->first + "' (frozen: a LoRA model's base weights?); ucp-reshard does not "
                "carry frozen parameters yet, and a model written without them would load its initial values");
}

}  // namespace

Source LoadSource(const std::string& dir) {
  Source S = LoadAtomic(dir);
  // Global tensors (a DCP's, Megatron-LM's): no DeepSpeed layout, whatever model-states file a weights-only
  // conversion synthesized for the export.
  const std::string framework = S.manifest["source"].value("framework", std::string("?"));
  if (!S.model_states.root || GlobalTensorsFramework(framework))
    throw Error(dir + ": converted from a " + framework + " checkpoint, which carries no DeepSpeed model-states file: "
                "ucp-reshard " + dir + " -o OUT with a DeepSpeed layout converts it under Megatron-DeepSpeed's names first "
                "(OUT/.ucp-scratch-atomic), its optimizer's state with it; --format mcore and --format dcp write " +
                (framework == "megatron-lm" ? "Megatron-LM's layouts and torchtitan's" : "Megatron-LM's and torchtitan's layouts") +
                " from it directly");
  const std::string naming = S.manifest["source"].value("naming", "");
  if (naming != NamingName(Naming::Pipe) && naming != NamingName(Naming::Plain))
    throw Error(dir + ": the manifest's source naming is '" + naming + "'; ucp-reshard knows GPTModelPipe ('pipe') "
                "and GPTModel ('plain') names");
  S.naming = naming == "pipe" ? Naming::Pipe : Naming::Plain;
  // The layer count: from the parameter names (a plain DeepSpeed engine saves no Megatron args),
  // checked against args.num_layers where the checkpoint has it.
  std::vector<std::string> names;
  for (const Atom& a : S.atoms) {
    names.push_back(a.name);
    if (a.meta.value("fused_experts", int64_t{0}) > 0)
      throw Error(dir + ": parameter '" + a.name + "' holds DeepSpeed AutoEP's fused experts: ucp-reshard does not write "
                  "AutoEP layouts yet; DeepSpeed's universal load reads this atomic checkpoint as it is (\"checkpoint\": "
                  "{\"load_universal\": true}), at another expert-parallel degree too");
  }
  if (S.naming == Naming::Plain && !GptModelNames(names) && !S.manifest["source"].value("moe", false)) {
    PlaceInModule(S, dir + "/" + S.model_file);
    return S;
  }
  S.untied = std::any_of(names.begin(), names.end(), UntiedName);
  S.layers = LayerCountOf(names, S.naming);
  if (const Value* layers = ArgOf(S, "num_layers"); layers && layers->AsInt() != S.layers)
    throw Error(dir + "/" + S.model_file + ": args.num_layers is " + std::to_string(layers->AsInt()) + " but the parameter "
                "names hold " + std::to_string(S.layers) + " transformer layers");
  for (Atom& a : S.atoms) {
    a.place = PlaceOf(a.name, S.naming, S.layers);
    a.place.untied = S.untied;
  }
  if (S.manifest["source"].value("moe", false)) ReadExperts(S, dir + "/" + S.model_file);
  return S;
}

int64_t DerivedDivisibleBy(const Source& S) {
  if (S.padded_vocab <= 0 || S.vocab <= 0) return 0;
  auto fits = [&](int64_t d) {
    const int64_t m = d * S.tp;
    return (S.vocab + m - 1) / m * m == S.padded_vocab;
  };
  if (fits(128)) return 128;
  for (int64_t d = 1; d <= (int64_t{1} << 20); d *= 2)
    if (fits(d)) return d;
  return 0;
}

pt::ValuePtr CommonStep(const Source& S, const std::string& why) {
  pt::ValuePtr step;
  for (const Atom& a : S.atoms) {
    if (!a.has_step) throw Error(S.reader->dir() + ": parameter '" + a.name + "' has no step");
    pt::ValuePtr v = S.reader->ReadStep(a.name);
    if (step && pt::StepValue(*step) != pt::StepValue(*v))
      throw Error(S.reader->dir() + ": parameter '" + a.name + "' is at step " + std::to_string(pt::StepValue(*v)) + ", others at " +
                  std::to_string(pt::StepValue(*step)) + ": " + why);
    if (!step) step = v;
  }
  return step;
}

pt::ValuePtr GroupOptions(const Value& group) {
  auto options = Value::Make(Value::Kind::Dict);
  for (const auto& kv : group.dict.items())
    if (kv.key->kind != Value::Kind::Str || (kv.key->s != "params" && kv.key->s != "step")) options->dict.Set(kv.key, kv.value);
  return options;
}

bool SameGroupOptions(const Value& a, const Value& b, const std::function<bool(const std::string&)>& ignored) {
  auto options = [&](const Value& g) {
    std::map<std::string, const Value*> out;
    for (const auto& kv : g.AsDict().items())
      if (kv.key->kind == Value::Kind::Str && !ignored(kv.key->s)) out[kv.key->s] = kv.value.get();
    return out;
  };
  const auto x = options(a), y = options(b);
  if (x.size() != y.size()) return false;
  for (const auto& [key, v] : x) {
    auto it = y.find(key);
    if (it == y.end() || !v || !it->second || !pt::SameValue(*v, *it->second)) return false;
  }
  return true;
}

void RefuseUnknownGroups(const Source& S, const std::string& remedy) {
  const pt::ValuePtr groups = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!groups || !groups->IsSequence() || groups->items.size() < 2) return;
  for (size_t g = 0; g < groups->items.size(); ++g) {
    if (!groups->items[g] || !groups->items[g]->Get("wd_mult")) continue;
    if (std::none_of(S.atoms.begin(), S.atoms.end(), [&](const Atom& a) { return a.group == static_cast<int>(g); }))
      throw Error(S.reader->dir() + ": param group " + std::to_string(g) + " of " + std::to_string(groups->items.size()) +
                  " holds no parameter: the source did not save which parameter is in which group and its groups are not "
                  "Megatron-Core's default pair (ucp-convert's note says why), so the groups torch would load cannot be "
                  "written; " + remedy);
  }
}

}  // namespace ucp::reshard
