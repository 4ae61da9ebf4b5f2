// The plan as it is said: `--plan-only --json` (ToJson) and the table of `--plan-only` (ToText).
#include <array>
#include <cstdio>
#include <sstream>

#include "core/format.h"
#include "plan/convert_plan.h"

namespace ucp::plan {

nlohmann::json ConvertPlan::ToJson(const source::SourceIndex& L) const {
  nlohmann::json j;
  j["ranks"] = ranks;
  j["chunk_bytes"] = chunk_elems * 4;
  j["rounds"] = rounds;
  j["buffer_bytes"] = buffer_bytes;
  j["split_above_bytes"] = split_above;
  j["cut_above_bytes"] = cut_above;
  if (int64_t f = MaxInFlight(chunk_elems); f >= 0) j["in_flight_bytes"] = f;
  j["imbalance"] = Imbalance();
  j["read_imbalance"] = ReadImbalance();
  j["shared_records"] = shared_records.size();
  int64_t in = 0, out = 0;
  for (int r = 0; r < ranks; ++r) in += mapped_bytes[r], out += reduced_bytes[r];
  j["bytes_in"] = in;
  j["bytes_out"] = out;
  // What each reducer receives from other ranks' mappers: its share of the network.
  std::vector<int64_t> remote(ranks, 0);
  for (int r = 0; r < ranks; ++r)
    for (const Item& it : work[r])
      ForEachItemRun(params[it.param], it, 0, it.numel, [&](const Piece& pc, int64_t, int64_t n, int64_t) {
        if (pc.mapper != r) remote[r] += 4 * n;
      });
  nlohmann::json per = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    nlohmann::json files = nlohmann::json::array();
    for (int f : FilesMappedBy(r)) files.push_back(L.files[f].name);
    nlohmann::json carries = nlohmann::json::array();
    for (size_t f = 0; f < file_carrier.size(); ++f)
      if (file_carrier[f] == r) carries.push_back(L.files[f].name);
    per.push_back({{"rank", r}, {"maps", files}, {"bytes_in", mapped_bytes[r]}, {"items", work[r].size()},
                   {"bytes_out", reduced_bytes[r]}, {"elements_received", work_numel[r]}, {"bytes_from_other_ranks", remote[r]}, {"carries", carries},
                   {"bytes_carried", carried_bytes[r]}});
  }
  j["per_rank"] = per;
  // Per parameter and state, the rank reducing it, or the ranks of its parts in order.
  std::vector<std::array<std::vector<int>, kStates>> part_ranks(this->params.size());
  for (int r = 0; r < ranks; ++r)
    for (const Item& it : work[r]) {
      auto& v = part_ranks[it.param][static_cast<int>(it.state)];
      v.resize(it.parts, -1);
      v[it.part] = r;
    }
  nlohmann::json params = nlohmann::json::array();
  for (size_t p = 0; p < this->params.size(); ++p) {
    const auto& P = this->params[p];
    nlohmann::json red;
    for (int s = 0; s < states; ++s) {
      const auto& v = part_ranks[p][s];
      red[std::string(StateName(static_cast<State>(s)))] = v.size() > 1 ? nlohmann::json(v) : nlohmann::json(P.reducer[s]);
    }
    params.push_back({{"name", P.name}, {"shape", P.full_shape}, {"copies", P.copies.size()},
                      {"fragments", P.pieces.size()}, {"bytes", 4 * P.full_numel * states}, {"reducers", red}});
  }
  j["params"] = params;
  return j;
}

std::string ConvertPlan::ToText() const {
  std::ostringstream o;
  int64_t in = 0, out = 0;
  for (int r = 0; r < ranks; ++r) in += mapped_bytes[r], out += reduced_bytes[r];
  o << "plan: " << params.size() << " parameters x " << states << (states == 1 ? " state (the weights alone)" : " states") << " on " << ranks << " rank(s); reads "
    << HumanBytes(static_cast<double>(in)) << ", writes " << HumanBytes(static_cast<double>(out)) << " of tensors\n";
  int split = 0;  // (parameter, state) items written in parts
  for (const auto& w : work)
    for (const Item& it : w) split += it.split() && it.part == 0;
  o << "items: " << params.size() * states << " (parameter, state); ";
  if (split_above > 0)
    o << split << " of more than " << HumanBytes(double(split_above)) << " written in parts (--split-above), each part an item of the table\n";
  else
    o << "every one written whole (--split-above 0, or a store or source whose tensors are written whole)\n";
  o << "reading: ";
  if (cut_above > 0)
    o << "optimizer files of more than " << HumanBytes(double(cut_above)) << " cut between ranks (--split-above); "
      << shared_records.size() << " record(s) read in ranges by several ranks, their CRC-32s combined\n";
  else
    o << "every optimizer file read whole by one rank (--split-above 0)\n";
  const int64_t in_flight = MaxInFlight(chunk_elems);
  o << "shuffle: " << rounds << " round(s) of at most " << HumanBytes(4.0 * chunk_elems) << " per reducer"
    << (in_flight >= 0 ? ", at most " + HumanBytes(double(in_flight)) + " in flight per rank" : "") << " (--buffer "
    << HumanBytes(double(buffer_bytes)) << ")\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%6s %6s %12s %7s %12s %12s\n", "rank", "files", "bytes in", "items", "bytes out", "carried");
  o << buf;
  for (int r = 0; r < ranks; ++r) {
    int files = static_cast<int>(FilesMappedBy(r).size());
    std::snprintf(buf, sizeof buf, "%6d %6d %12s %7zu %12s %12s\n", r, files, HumanBytes(static_cast<double>(mapped_bytes[r])).c_str(),
                  work[r].size(), HumanBytes(static_cast<double>(reduced_bytes[r])).c_str(),
                  HumanBytes(static_cast<double>(carried_bytes[r])).c_str());
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "imbalance of bytes out, carried files included (max / mean): %.3f\n", Imbalance());
  o << buf;
  std::snprintf(buf, sizeof buf, "imbalance of bytes in (max / mean): %.3f\n", ReadImbalance());
  o << buf;
  return o.str();
}

}  // namespace ucp::plan
