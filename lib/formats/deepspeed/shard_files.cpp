#include "formats/deepspeed/shard_files.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"

namespace ucp::deepspeed {
namespace fs = std::filesystem;
using source::ShardFile;
using source::SourceIndex;

std::string ResolveShardDir(const std::string& dir, std::string* tag) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw Error(dir + ": does not exist");
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a directory");
  fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest)) {
    // A root whose `latest` is gone (Trainer's checkpoint-N holds scheduler.pt: no tag folder itself).
    if (const auto tags = source::TagFoldersWithoutLatest(dir); !tags.empty()) throw Error(source::TagWithoutLatestError(dir, tags));
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".pt") {
        *tag = fs::path(dir).filename().string();
        return dir;
      }
    throw Error(dir + ": no .pt shard files and no 'latest' file: not a DeepSpeed checkpoint folder");
  }
  *tag = source::ReadLatestTag(dir);
  fs::path shard_dir = fs::path(dir) / *tag;
  if (!fs::is_directory(shard_dir)) throw Error(latest.string() + ": names '" + *tag + "', which is not a folder");
  return shard_dir.string();
}

namespace {

constexpr std::pair<FileKind, const char*> kKindNames[] = {{FileKind::ModelStates, "model_states"},
                                                           {FileKind::LayerStates, "layer_states"},
                                                           {FileKind::ZeroOptimizer, "optimizer_states"},
                                                           {FileKind::Zero3ModelStates, "zero3_model_states"},
                                                           {FileKind::ExpertStates, "expert_states"},
                                                           {FileKind::ExpertOptimizer, "expert_optimizer_states"}};

// The index's record of a file its name describes.
ShardFile ShardFileOf(const std::string& n, const FileName& parsed) {
  ShardFile f;
  f.name = n, f.kind = KindName(parsed.kind), f.dp = parsed.dp;
  f.data = parsed.kind == FileKind::ZeroOptimizer;
  // What DeepSpeed's universal load reads besides the atomic tensors: the model-states files, and
  // a Mixture-of-Experts model's expert files (its load_moe_state_dict).
  f.carried = parsed.kind == FileKind::ModelStates || parsed.kind == FileKind::Zero3ModelStates ||
              parsed.kind == FileKind::ExpertStates;
  f.per_dp = parsed.kind == FileKind::ZeroOptimizer || parsed.kind == FileKind::Zero3ModelStates ||
             parsed.kind == FileKind::ExpertOptimizer;
  if (parsed.kind == FileKind::LayerStates) f.layer = parsed.layer, f.tp = parsed.tp;
  if (parsed.kind == FileKind::ExpertStates) f.layer = parsed.layer, f.expert = parsed.expert;
  return f;
}

}  // namespace

const char* KindName(FileKind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  return "?";
}

FileKind KindOf(const ShardFile& f) {
  for (const auto& [kind, name] : kKindNames)
    if (f.kind == name) return kind;
  throw Error("internal: file kind '" + f.kind + "'");
}

long CountOf(const SourceIndex& L, FileKind k) {
  return std::count_if(L.files.begin(), L.files.end(), [&](const ShardFile& f) { return KindOf(f) == k; });
}

FileNames FindShardFiles(SourceIndex& L) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(L.dir))
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  FileNames out;
  for (const auto& n : names) {
    const auto parsed = ParseFileName(n);
    if (!parsed) {
      if (n.size() > 3 && n.substr(n.size() - 3) == ".pt") L.notes.push_back(n + ": unrecognised file name, ignored");
      continue;
    }
    out.mps.push_back(parsed->mp);
    out.any_bf16_prefix |= parsed->prefix == "bf16_";
    L.files.push_back(ShardFileOf(n, *parsed));
  }
  if (CountOf(L, FileKind::ModelStates) == 0 && CountOf(L, FileKind::Zero3ModelStates) == 0)
    throw Error(L.dir + ": no mp_rank_*_model_states.pt or zero_pp_rank_*_model_states.pt file: not a DeepSpeed "
                        "checkpoint folder");
  return out;
}

void PlaceOnGrid(SourceIndex& L, const FileNames& names, bool zero3_files) {
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    ShardFile& f = L.files[fi];
    if (KindOf(f) == FileKind::LayerStates) continue;
    if (zero3_files) {
      f.tp = names.mps[fi], f.pp = 0;  // ZeRO-3 names files by TP rank (no PP)
    } else {
      f.pp = names.mps[fi] / L.tp, f.tp = names.mps[fi] % L.tp;  // the inverse of MpRank
    }
  }
}

namespace {

// Every layer file of a pipeline at every TP rank.
void CheckLayerFiles(SourceIndex& L) {
  std::map<int, std::set<int>> layer_files;
  for (const auto& f : L.files)
    if (KindOf(f) == FileKind::LayerStates) layer_files[f.layer].insert(f.tp);
  for (const auto& [layer, tps] : layer_files)
    for (int tp = 0; tp < L.tp; ++tp)
      if (!tps.count(tp))
        L.problems.push_back("missing rank file " + LayerStatesFileName(layer, tp) + " (layer " + std::to_string(layer) +
                             ", tp=" + std::to_string(tp) + ")");
}

}  // namespace

bool CheckFileGrid(SourceIndex& L, const FileNames& names, bool zero3_files, bool optimizer_files) {
  std::set<std::string> present;
  for (const auto& f : L.files) present.insert(f.name);
  const bool any_optimizer = std::any_of(L.files.begin(), L.files.end(), [](const ShardFile& f) {
    return KindOf(f) == FileKind::ZeroOptimizer || KindOf(f) == FileKind::ExpertOptimizer;
  });
  if (optimizer_files && !any_optimizer) {  // one reason, not a missing file per rank
    L.errors.push_back("no optimizer states file (" + OptimStatesFileName(names.any_bf16_prefix ? "bf16_" : "", 0, 0) +
                       ", ...): ucp reads a DeepSpeed checkpoint's weights from its optimizer files, the fp32 masters; "
                       "this tag holds the model's files alone (ucp-reshard --no-optimizer writes such a tag, for "
                       "--finetune): convert the atomic checkpoint it was made from instead");
    return false;
  }
  std::string prefix = names.any_bf16_prefix ? "bf16_" : "";
  auto expect = [&](const std::string& name, const std::string& what) {
    if (!present.count(name)) L.problems.push_back("missing rank file " + name + " (" + what + ")");
  };
  for (int pp = 0; pp < L.pp; ++pp)
    for (int tp = 0; tp < L.tp; ++tp) {
      const int mp = zero3_files ? tp : MpRank(pp, tp, L.tp);
      std::string coords = "pp=" + std::to_string(pp) + ", tp=" + std::to_string(tp);
      if (!zero3_files) expect(ModelStatesFileName(mp), coords);
      for (int dp = 0; dp < L.dp; ++dp) {
        std::string c = coords + ", dp=" + std::to_string(dp);
        if (optimizer_files) expect(OptimStatesFileName(prefix, dp, mp), c);
        if (zero3_files) expect(Zero3ModelStatesFileName(dp, mp), c);
      }
    }
  for (const auto& f : L.files) {
    // (an expp_rank file's "dp" is its expert-parallel rank: below dp x tp, ExpertGroups)
    const int dps = KindOf(f) == FileKind::ExpertOptimizer ? L.dp * L.tp : L.dp;
    bool outside = KindOf(f) == FileKind::LayerStates ? f.tp >= L.tp : (f.tp >= L.tp || f.pp >= L.pp || f.dp >= dps);
    if (outside) L.problems.push_back(f.name + ": rank " + Coord(f) + " lies outside the layout's degrees");
  }
  if (L.naming == "pipe") CheckLayerFiles(L);
  return true;
}

std::shared_ptr<pt::TorchFile> ShardReader::operator()(const ShardFile& f) {
  auto it = read_.find(f.name);
  if (it != read_.end()) return it->second;
  std::shared_ptr<pt::TorchFile> file;
  try {
    file = std::make_shared<pt::TorchFile>(pt::ReadTorchFile(
        L_.dir + "/" + f.name, {.verify_pickle_crc = true, .verify_storage_crc = options_.verify_storage_crc}));
  } catch (const std::exception& e) {
    L_.errors.push_back(e.what());
  }
  read_[f.name] = file;
  return file;
}

}  // namespace ucp::deepspeed
