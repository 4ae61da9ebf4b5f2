#include "source/source_index.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/names.h"
#include "core/xxhash64.h"

namespace ucp::source {
namespace fs = std::filesystem;

const ParamRecord* SourceIndex::Find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t SourceIndex::Fact(const std::string& key) const {
  auto it = model_facts.find(key);
  return it == model_facts.end() ? -1 : it->second;
}

void TakeMegatronArgs(const pt::Value* args, SourceIndex& L) {
  auto integer = [&](const char* key) -> int64_t {
    auto v = args ? args->Get(key) : nullptr;
    return v && v->kind == pt::Value::Kind::Int ? v->i : -1;
  };
  for (const char* key : {"num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "kv_channels",
                          "ffn_hidden_size", "padded_vocab_size", "make_vocab_size_divisible_by", "seq_length",
                          "micro_batch_size"})
    if (int64_t v = integer(key); v >= 0) L.model_facts[key] = v;
  const int64_t sp = integer("ds_sequence_parallel_size");
  if (sp < 1) {
    if (L.dp > 1)
      L.notes.push_back("DP x SP = " + std::to_string(L.dp) + "; SP not recorded in the files (DeepSpeed stores no "
                        "Ulysses degree, Megatron's args do when the job ran it): dp=" + std::to_string(L.dp) +
                        " counts DP x SP ranks");
    return;
  }
  if (sp > L.dp || L.dp % sp != 0) {
    L.problems.push_back("args ds_sequence_parallel_size " + std::to_string(sp) + " does not divide the " +
                         std::to_string(L.dp) + " ranks ZeRO partitions over (dp_world_size): SP read as 1");
    return;
  }
  L.sp = static_cast<int>(sp), L.sp_recorded = true;
  if (int64_t seq_dp = integer("sequence_data_parallel_size"); seq_dp > 0 && seq_dp != L.dp)
    L.problems.push_back("args sequence_data_parallel_size " + std::to_string(seq_dp) + " != dp_world_size " +
                         std::to_string(L.dp));
}

int64_t ArgInt(const pt::Value* args, const char* key, int64_t otherwise) {
  auto v = args ? args->Get(key) : nullptr;
  return !v || v->kind == pt::Value::Kind::None ? otherwise : v->AsInt();
}

bool ArgIsSet(const pt::Value* a) {
  return a && a->kind != pt::Value::Kind::None && !(a->kind == pt::Value::Kind::Bool && !a->b) &&
         !(a->kind == pt::Value::Kind::Int && a->i == 0) && !(a->kind == pt::Value::Kind::Float && a->f == 0.0);
}

bool ArgSet(const pt::Value* args, const char* key) { return args && ArgIsSet(args->Get(key).get()); }

std::map<std::string, int64_t> MegatronDegrees(const pt::Value* args, int files_world) {
  std::map<std::string, int64_t> out;
  if (!args) return out;
  auto degree = [&](const char* key) -> int64_t {
    auto v = args->Get(key);
    return v && v->kind == pt::Value::Kind::Int ? v->i : -1;
  };
  for (const auto& [key, name] : {std::pair<const char*, const char*>{"tensor_model_parallel_size", "tp"}, {"pipeline_model_parallel_size", "pp"},
                                  {"data_parallel_size", "dp"}, {"expert_model_parallel_size", "ep"}, {"context_parallel_size", "cp"}})
    if (const int64_t d = degree(key); d >= 1) out[name] = d;
  const int64_t world = degree("world_size"), model = out.count("tp") && out.count("pp") ? out["tp"] * out["pp"] * (out.count("cp") ? out["cp"] : 1) : -1;
  // (a world that holds no whole number of DP ranks, or whose DP the EP does not divide, is args' default, not the job's)
  // (world_size 1 is parse_args' default where no launcher set WORLD_SIZE: a launched job's validated args say data_parallel_size)
  if (!out.count("dp") && world >= files_world && world >= 2 && model >= 1 && world % model == 0 &&
      (world / model) % (out.count("ep") ? out["ep"] : 1) == 0)
    out["dp"] = world / model;
  out["dp_recorded"] = out.count("dp");
  if (!out["dp_recorded"] && model >= 1 && files_world > 0) out["dp"] = (files_world + model - 1) / model;
  return out;
}

std::string MegatronLayout(const pt::Value* args, int files_world) {
  std::string s;
  const std::map<std::string, int64_t> degrees = MegatronDegrees(args, files_world);
  for (const char* name : {"tp", "pp", "dp", "ep", "cp"}) {
    auto it = degrees.find(name);
    if (it == degrees.end() || (it->second == 1 && (std::string(name) == "ep" || std::string(name) == "cp"))) continue;
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(c - 'a' + 'A');
    const bool least = upper == "DP" && !degrees.at("dp_recorded");
    s += (s.empty() ? "" : ", ") + upper + (least ? " >= " : "=") + std::to_string(it->second);
  }
  if (s.empty()) return s;
  return s + (degrees.count("dp") && !degrees.at("dp_recorded") ? " (its args; DP the least its files show: the args record none)" : " (its args)");
}

const pt::Value* MegatronArgsOf(const SourceIndex& L) {
  if (L.args) return L.args.get();
  if (L.args_state) return L.args_state->Get("args").get();
  return nullptr;
}

std::string DataParallelDegrees(const SourceIndex& L) {
  if (L.sp_recorded) return "dp=" + std::to_string(L.DataParallel()) + " sp=" + std::to_string(L.sp);
  return "dp=" + std::to_string(L.dp);
}

std::string Coord(const ShardFile& f) {
  return "(pp=" + std::to_string(f.pp) + ", tp=" + std::to_string(f.tp) + ", dp=" + std::to_string(f.dp) + ")";
}

std::string FileWhere(const SourceIndex& L, int file) {
  const ShardFile& f = L.files[static_cast<size_t>(file)];
  return L.dir + "/" + f.name + (L.on_grid ? " " + Coord(f) : "");  // off a grid the coordinates mean nothing: the name says the rank
}

std::string LayoutWords(const SourceIndex& L) {
  const std::string state = " (" + L.optimizer + "), " + L.dtype;
  if (!L.on_grid) {  // every chunk is a box of its global tensor; a carried file holds none
    const auto data = std::count_if(L.files.begin(), L.files.end(), [](const ShardFile& f) { return !f.carried; });
    const std::string job = MegatronLayout(MegatronArgsOf(L), L.files_world);  // what the saving job ran, where its args say
    const std::string saved_by = job.empty() ? "" : "; saved by a job of " + job;
    if (L.optimizer == "none") return "global tensors in chunks, " + std::to_string(data) + " data file(s); model weights only, " + L.dtype + saved_by;
    return "global tensors in chunks, " + std::to_string(data) + " data file(s); optimizer state " +
           (L.state_in_buckets ? "in Megatron's gradient buckets" : "per parameter") + state + saved_by;
  }
  std::string s = DataParallelDegrees(L) + " tp=" + std::to_string(L.tp) + " pp=" + std::to_string(L.pp) +
                  (L.moe || L.ep != 1 ? " ep=" + std::to_string(L.ep) : "") + "  ZeRO-" + std::to_string(L.zero_stage) + state;
  if (L.sp != 1) s += "; ZeRO over DP x SP = " + std::to_string(L.dp) + " ranks";
  else if (!L.sp_recorded && L.dp != 1 && L.job.empty()) s += "; SP not recorded: dp counts DP x SP ranks";  // Megatron's Ulysses: no Hugging Face job's
  return s;
}

std::string ReadLatestTag(const std::string& root) {
  const std::string latest = root + "/latest";
  const std::optional<std::string> text = ReadWholeFile(latest);
  if (!text) throw Error(latest + ": cannot read");
  const size_t b = text->find_first_not_of(" \t\r\n"), e = text->find_last_not_of(" \t\r\n");
  const std::string tag = b == std::string::npos ? "" : text->substr(b, e - b + 1);
  WithContext(latest, [&] { RequirePlainName(tag, "the tag"); });
  return tag;
}

std::vector<std::string> TagFoldersWithoutLatest(const std::string& root) {
  namespace fs = std::filesystem;
  std::vector<std::string> tags;
  std::error_code ec;
  if (fs::exists(fs::path(root) / "latest", ec)) return tags;
  auto shard = [](const std::string& n) {
    for (const char* end : {"model_states.pt", "optim_states.pt"})
      if (n.size() > std::strlen(end) && n.compare(n.size() - std::strlen(end), std::string::npos, end) == 0) return true;
    return false;
  };
  for (const auto& child : fs::directory_iterator(root, ec)) {
    if (!child.is_directory(ec)) continue;
    for (const auto& e : fs::directory_iterator(child.path(), ec))
      if (shard(e.path().filename().string())) {
        tags.push_back(child.path().filename().string());
        break;
      }
  }
  std::sort(tags.begin(), tags.end());
  return tags;
}

std::string TagWithoutLatestError(const std::string& root, const std::vector<std::string>& tags) {
  std::string names;
  for (size_t i = 0; i < tags.size(); ++i) names += (i ? ", " : "") + tags[i] + "/";
  return root + ": holds DeepSpeed's checkpoint tag" + (tags.size() > 1 ? "s " : " ") + names + " but no `latest` naming the one to "
         "read (deleted, or not copied with the folder?): write the tag into it, as DeepSpeed does (echo " +
         (tags.size() == 1 ? tags.front() : std::string("TAG")) + " > " +
         root + "/latest), and give " + root + " again; a training checkpoint is never read as a Hugging Face model";
}

std::string FolderFingerprint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().filename() != kReshardMarker) names.push_back(e.path().filename().string());
  if (ec) throw Error(dir + ": cannot list: " + ec.message());
  std::sort(names.begin(), names.end());
  std::string text;
  for (const auto& n : names) {
    std::ifstream in(dir + "/" + n, std::ios::binary | std::ios::ate);
    const std::streamoff size = in.tellg();
    if (!in || size < 0) throw Error(dir + "/" + n + ": cannot read");
    const std::streamoff tail = std::min<std::streamoff>(size, std::streamoff{64} << 10);
    std::string last(static_cast<size_t>(tail), '\0');
    in.seekg(size - tail);
    if (!in.read(last.data(), tail)) throw Error(dir + "/" + n + ": cannot read");
    text += n + " " + std::to_string(size) + " " + HexDigest(XxHash64::Of(last.data(), last.size())) + "\n";
  }
  return HexDigest(XxHash64::Of(text.data(), text.size()));
}

}  // namespace ucp::source
