#include "formats/deepspeed/coverage.h"

#include <algorithm>
#include <set>

namespace ucp::deepspeed {
using source::Fragment;
using source::ParamRecord;
using source::SourceIndex;
using Partitions = std::map<std::tuple<int, int, int>, int64_t>;

void PlaceByFragments(SourceIndex& L, GroupParams& group_params) {
  // (param, pp, tp) -> its smallest flat position there, and that fragment
  std::map<std::tuple<int, int, int>, std::pair<int64_t, const Fragment*>> first;
  auto copy_of = [&](const Fragment& fr) { return std::make_tuple(fr.param, L.files[fr.file].pp, L.CopyTp(fr)); };
  for (const auto& fr : L.fragments) {
    auto [it, fresh] = first.emplace(copy_of(fr), std::make_pair(fr.dst_start, &fr));
    if (!fresh && fr.dst_start < it->second.first) it->second = {fr.dst_start, &fr};
  }
  std::vector<int64_t> shift(L.fragments.size());
  for (size_t k = 0; k < L.fragments.size(); ++k) shift[k] = first.at(copy_of(L.fragments[k])).first;
  for (size_t k = 0; k < L.fragments.size(); ++k) L.fragments[k].dst_start -= shift[k];
  std::map<std::tuple<int, int, int>, std::vector<std::tuple<int64_t, std::string, int64_t>>> lists;
  std::set<int> placed;
  for (const auto& [copy, where] : first) {
    const auto [param, pp, tp] = copy;
    const Fragment& fr = *where.second;
    ParamRecord& p = L.params[param];
    if (p.group < 0) p.group = fr.group;  // ZeRO: the file's slot is the param group
    placed.insert(param);
    if (const auto shape = p.tp_shape.find(tp); shape != p.tp_shape.end())
      lists[{pp, tp, p.group}].emplace_back(where.first, p.name, pt::Numel(shape->second));
  }
  for (size_t k = 0; k < L.params.size(); ++k)
    if (!placed.count(static_cast<int>(k)))
      L.problems.push_back("parameter '" + L.params[k].name + "' is in the model but in no optimizer group (missing fragment)");
  for (auto& [key, list] : lists) {
    std::sort(list.begin(), list.end());
    for (const auto& [at, name, numel] : list) group_params[key].push_back({name, numel});
  }
}

namespace {

std::string FileOf(const SourceIndex& L, const Fragment* fr) {
  return L.files[fr->file].name + " " + Coord(L.files[fr->file]);
}

// In each file's flat group buffer no two fragments may share an element.
void CheckFlatOverlaps(SourceIndex& L) {
  std::map<std::pair<int, int>, std::vector<const Fragment*>> by_file;  // (file, group)
  for (const auto& fr : L.fragments) by_file[{fr.file, fr.group}].push_back(&fr);
  for (auto& [key, list] : by_file) {
    std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->src_start < b->src_start; });
    for (size_t k = 1; k < list.size(); ++k)
      if (list[k]->src_start < list[k - 1]->src_start + list[k - 1]->numel)
        L.problems.push_back(L.dir + "/" + FileOf(L, list[k]) + ": group " + std::to_string(key.second) +
                             ": the fragments of parameters '" + L.params[list[k - 1]->param].name + "' and '" +
                             L.params[list[k]->param].name + "' overlap at flat elements [" +
                             std::to_string(list[k]->src_start) + ", " +
                             std::to_string(std::min(list[k]->src_start + list[k]->numel,
                                                     list[k - 1]->src_start + list[k - 1]->numel)) +
                             ") (overlapping fragments)");
  }
}

// One fault, one error: a gap whose holder is a file already reported missing or unreadable follows
// from that report; it is folded into it (the parameters counted) instead of repeated per parameter.
class GapReports {
 public:
  explicit GapReports(SourceIndex& L) : L_(L) {}

  // A gap of parameter `name` whose elements `holder_text` should hold: folded into the report of
  // that file, else `message`.
  void Report(const std::string& holder_text, const std::string& name, const std::string& message) {
    const std::string file = holder_text.rfind("(", 0) == 0 ? "" : holder_text.substr(0, holder_text.find(' '));
    for (size_t i = 0; i < L_.errors.size() && !file.empty(); ++i)
      if (L_.errors[i].find("/" + file + ":") != std::string::npos) return folded_[{0, i}].push_back(name);
    for (size_t i = 0; i < L_.problems.size(); ++i)
      if (L_.problems[i].rfind("missing rank file ", 0) == 0 && L_.problems[i].find(holder_text) != std::string::npos)
        return folded_[{1, i}].push_back(name);
    L_.problems.push_back(message);
  }

  // Each report gaps were folded into says how many parameters lack elements.
  void Fold() {
    for (auto& [where, names] : folded_) {
      std::string& m = where.first == 0 ? L_.errors[where.second] : L_.problems[where.second];
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
      m += "; so " + std::to_string(names.size()) + " parameter" + (names.size() == 1 ? " lacks" : "s lack") +
           " the elements only it held ('" + names.front() + "'" + (names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more" : "") + ")";
    }
  }

 private:
  SourceIndex& L_;
  std::map<std::pair<int, size_t>, std::vector<std::string>> folded_;  // (0 errors / 1 problems, index) -> parameters
};

// A parameter's TP-local copy in its group's list at (pp, tp).
struct ParamCopy {
  std::tuple<int, int, int> key;  // (pp, tp, group)
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;  // of the parameter in the group's flat buffer (ZeRO-1/2)
};

// The optimizer file that should hold element `e` of copy c.
std::string HolderOf(const SourceIndex& L, const Partitions& partitions, const ParamCopy& c, int64_t e) {
  const int pp = std::get<0>(c.key), tp = std::get<1>(c.key);
  int dp = 0;
  if (L.zero_stage == 3) {
    dp = static_cast<int>(e / std::max<int64_t>(1, (c.numel + L.dp - 1) / L.dp));
  } else if (auto it = partitions.find(c.key); it != partitions.end() && it->second > 0) {
    dp = static_cast<int>((c.offset + e) / it->second);
  }
  for (const auto& f : L.files)
    if (f.data && f.pp == pp && f.tp == tp && f.dp == dp) return f.name + " " + Coord(f);
  return "(pp=" + std::to_string(pp) + ", tp=" + std::to_string(tp) + ", dp=" + std::to_string(dp) + ")";
}

// Every element of copy c in exactly one of its fragments `list`.
void CheckCopyCovered(SourceIndex& L, const Partitions& partitions, const ParamCopy& c,
                      std::vector<const Fragment*>& list, GapReports& gaps) {
  const int64_t numel = c.numel;
  auto holder = [&](int64_t e) { return HolderOf(L, partitions, c, e); };
  std::string what = "parameter '" + c.name + "' (pp=" + std::to_string(std::get<0>(c.key)) +
                     ", tp=" + std::to_string(std::get<1>(c.key)) + ")";
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->dst_start < b->dst_start; });
  int64_t at = 0;
  const Fragment* prev = nullptr;
  for (const Fragment* fr : list) {
    if (fr->dst_start < 0 || fr->dst_start + fr->numel > numel) {
      L.problems.push_back(L.dir + "/" + FileOf(L, fr) + ": " + what + ": its fragment covers elements [" +
                           std::to_string(fr->dst_start) + ", " + std::to_string(fr->dst_start + fr->numel) +
                           ") of a tensor of " + std::to_string(numel) + ": its param_slice_mappings do not fit "
                           "its rank's place in the group's flat buffer (a file of another rank, swapped or renamed?)");
      continue;
    }
    if (fr->dst_start > at)
      gaps.Report(holder(at), c.name, what + ": elements [" + std::to_string(at) + ", " + std::to_string(fr->dst_start) +
                                          ") are in no optimizer file (missing fragment; expected in " + holder(at) + ")");
    else if (fr->dst_start < at && prev)
      L.problems.push_back(what + ": elements [" + std::to_string(fr->dst_start) + ", " +
                           std::to_string(std::min(at, fr->dst_start + fr->numel)) + ") are in both " +
                           FileOf(L, prev) + " and " + FileOf(L, fr) + " (overlapping fragments)");
    at = std::max(at, fr->dst_start + fr->numel);
    prev = fr;
  }
  if (at < numel)
    gaps.Report(holder(at), c.name, what + ": elements [" + std::to_string(at) + ", " + std::to_string(numel) + ") of " +
                                        std::to_string(numel) + " are in no optimizer file (missing fragment; expected in " +
                                        holder(at) + ")");
}

}  // namespace

void CheckCoverage(SourceIndex& L, GroupParams& group_params, const Partitions& partitions) {
  CheckFlatOverlaps(L);
  std::map<std::string, int> index;
  for (size_t k = 0; k < L.params.size(); ++k) index[L.params[k].name] = static_cast<int>(k);
  GapReports gaps(L);
  std::map<std::tuple<int, int, int>, std::vector<const Fragment*>> by_param;  // (param, pp, tp)
  for (const auto& fr : L.fragments) by_param[{fr.param, L.files[fr.file].pp, L.CopyTp(fr)}].push_back(&fr);
  for (const auto& [key, params] : group_params) {
    int64_t offset = 0;
    for (const auto& [name, numel] : params) {
      const ParamCopy copy{key, name, numel, offset};
      offset += numel;
      CheckCopyCovered(L, partitions, copy, by_param[{index.at(name), std::get<0>(key), std::get<1>(key)}], gaps);
    }
  }
  gaps.Fold();
}

}  // namespace ucp::deepspeed
