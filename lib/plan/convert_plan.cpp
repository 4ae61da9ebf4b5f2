#include "plan/convert_plan.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "core/format.h"

namespace ucp::plan {
namespace fs = std::filesystem;
using patterns::Pattern;

std::string_view StateName(State s) {
  switch (s) {
    case State::Fp32: return "fp32";
    case State::ExpAvg: return "exp_avg";
    case State::ExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

std::vector<int> AssignLpt(const std::vector<int64_t>& weights, int bins) {
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  using Load = std::pair<int64_t, int>;  // (bytes, bin): the lightest bin, lowest index on ties
  std::priority_queue<Load, std::vector<Load>, std::greater<>> heap;
  for (int b = 0; b < bins; ++b) heap.push({0, b});
  std::vector<int> out(weights.size(), 0);
  for (size_t k : order) {
    auto [load, bin] = heap.top();
    heap.pop();
    out[k] = bin;
    heap.push({load + weights[k], bin});
  }
  return out;
}

std::vector<int> AssignLocal(const std::vector<int64_t>& weights, std::vector<int64_t> load,
                             const std::function<int64_t(size_t, int)>& affinity, double slack) {
  const int bins = static_cast<int>(load.size());
  int64_t total = 0, heaviest = 0;
  for (auto w : load) total += w;
  for (auto w : weights) total += w, heaviest = std::max(heaviest, w);
  const double cap = std::max(static_cast<double>(total) / bins * (1 + slack), static_cast<double>(heaviest));
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  std::vector<int> out(weights.size(), 0);
  for (size_t k : order) {
    int best = -1;  // the bin with the most affinity that has room; ties to the lowest index
    int64_t best_affinity = 0;
    for (int b = 0; b < bins; ++b) {
      const int64_t a = affinity(k, b);
      if (a > best_affinity && static_cast<double>(load[b] + weights[k]) <= cap) best = b, best_affinity = a;
    }
    if (best < 0) best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[k] = best;
    load[best] += weights[k];
  }
  return out;
}

namespace {

// Rows of each sub-parameter held by each TP rank: widths[i][t].
std::vector<std::vector<int64_t>> SubParamWidths(const patterns::ParamPattern& pp, const patterns::ModelPatterns& M,
                                                 const source::ParamRecord& rec, int tp, int dim) {
  const auto& sizes = pp.sub_param_sizes;
  std::vector<std::vector<int64_t>> w(sizes.size(), std::vector<int64_t>(tp));
  if (pp.match && pp.match->n_sub_params == 2) {
    for (int t = 0; t < tp; ++t) {
      int64_t rows = rec.tp_shape.at(t)[dim];
      if (rows % 2) throw Error("parameter '" + pp.name + "': a fused pair of sub-parameters with an odd row count " +
                                std::to_string(rows) + " at tp=" + std::to_string(t));
      w[0][t] = w[1][t] = rows / 2;
    }
    return w;
  }
  const std::vector<std::vector<int64_t>>* given = nullptr;
  if (M.checkpoint_rules && pp.match) {
    auto it = M.checkpoint_rules->shard_widths.find(pp.match->rule);
    if (it != M.checkpoint_rules->shard_widths.end()) given = &it->second;
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int t = 0; t < tp; ++t) {
      if (given) {
        if (given->size() != sizes.size() || (*given)[i].size() != static_cast<size_t>(tp))
          throw Error("parameter '" + pp.name + "': sub_param_shard_widths do not list " + std::to_string(sizes.size()) +
                      " sub-parameters x " + std::to_string(tp) + " TP ranks");
        w[i][t] = (*given)[i][t];
      } else {
        if (sizes[i] % tp)
          throw Error("parameter '" + pp.name + "': sub-parameter " + std::to_string(i) + " of " +
                      std::to_string(sizes[i]) + " rows does not split evenly over " + std::to_string(tp) +
                      " TP ranks and the checkpoint gives no sub_param_shard_widths");
        w[i][t] = sizes[i] / tp;
      }
    }
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t sum = 0;
    for (int t = 0; t < tp; ++t) sum += w[i][t];
    if (sum != sizes[i])
      throw Error("parameter '" + pp.name + "': the shard widths of sub-parameter " + std::to_string(i) + " add up to " +
                  std::to_string(sum) + ", not its " + std::to_string(sizes[i]) + " rows");
  }
  return w;
}

ParamPlan PlanParam(const source::SourceIndex& L, const patterns::ModelPatterns& M, int index,
                    const patterns::ParamPattern& pat) {
  const source::ParamRecord& rec = L.params[index];
  ParamPlan P;
  P.index = index;
  P.name = rec.name;
  P.full_shape = pat.full_shape;
  P.full_numel = pt::Numel(P.full_shape);
  P.joined_shape = pat.full_shape;
  if (pat.vocab_padding_rows > 0) P.joined_shape[0] += pat.vocab_padding_rows;
  const Pattern here = pat.here;
  const bool sharded = L.tp > 1 && patterns::IsSplit(here);
  const int dim = sharded ? pat.split_dim() : -1;  // sharded: `here` is the model pattern
  std::vector<std::vector<int64_t>> widths;
  if (sharded && here == Pattern::ShardNC) widths = SubParamWidths(pat, M, rec, L.tp, dim);

  std::vector<int> stages(rec.stages.begin(), rec.stages.end());
  if (here == Pattern::Partial) stages.resize(1);  // later stages' copies are not averaged in
  std::vector<Copy> place, rest;
  for (size_t si = 0; si < stages.size(); ++si) {
    int64_t offset = 0;  // along the split dim
    for (int t = 0; t < (rec.WholeOverTp() ? 1 : L.tp); ++t) {  // an expert: one whole copy (ParamRecord)
      Copy c;
      c.pp = stages[si], c.tp = t;
      c.shape = rec.tp_shape.at(t);
      c.numel = pt::Numel(c.shape);
      if (sharded) {
        c.split_dim = dim;
        if (dim >= static_cast<int>(c.shape.size()) || c.shape.size() != P.joined_shape.size())
          throw Error("parameter '" + P.name + "': TP-local shape " + pt::ShapeString(c.shape) + " cannot be joined on dim " +
                      std::to_string(dim) + " into " + pt::ShapeString(P.joined_shape));
        if (here == Pattern::ShardNC) {
          int64_t local = 0, joined = 0;
          for (size_t i = 0; i < widths.size(); ++i) {
            int64_t before = 0;
            for (int u = 0; u < t; ++u) before += widths[i][u];
            c.blocks.push_back({local, widths[i][t], joined + before});
            local += widths[i][t];
            joined += pat.sub_param_sizes[i];
          }
          if (local != c.shape[dim])
            throw Error("parameter '" + P.name + "': the sub-parameter widths at tp=" + std::to_string(t) + " add up to " +
                        std::to_string(local) + " rows but the rank holds " + std::to_string(c.shape[dim]));
        } else {
          c.blocks.push_back({0, c.shape[dim], offset});
        }
        offset += c.shape[dim];
        for (size_t k = 0; k < c.shape.size(); ++k)
          if (static_cast<int>(k) != dim && c.shape[k] != P.joined_shape[k])
            throw Error("parameter '" + P.name + "': TP-local shape " + pt::ShapeString(c.shape) + " at tp=" +
                        std::to_string(t) + " does not match the joined shape " + pt::ShapeString(P.joined_shape));
      } else if (c.shape != P.joined_shape) {
        throw Error("parameter '" + P.name + "' is " + std::string(patterns::PatternName(here)) + " but holds shape " +
                    pt::ShapeString(c.shape) + " at (pp=" + std::to_string(c.pp) + ", tp=" + std::to_string(t) +
                    "), not " + pt::ShapeString(P.joined_shape));
      }
      bool first = si == 0 && (t == 0 || sharded);
      if (here == Pattern::Partial) c.mode = t == 0 ? CopyMode::Place : CopyMode::Accumulate;
      else if (first) c.mode = CopyMode::Place;
      else c.mode = si > 0 && pat.pp_replicated ? CopyMode::Observe : CopyMode::Compare;
      (c.mode == CopyMode::Place || c.mode == CopyMode::Accumulate ? place : rest).push_back(std::move(c));
    }
    if (sharded && offset != P.joined_shape[dim])
      throw Error("parameter '" + P.name + "': its TP pieces hold " + std::to_string(offset) + " rows on dim " +
                  std::to_string(dim) + ", the joined tensor " + std::to_string(P.joined_shape[dim]));
  }
  P.averaged = pat.model_pattern == Pattern::Partial;
  P.accumulated_copies = here == Pattern::Partial ? L.tp : 1;
  for (auto* list : {&place, &rest})
    for (auto& c : *list) {
      c.stream_start = P.stream_numel;
      P.stream_numel += c.numel;
      P.copies.push_back(std::move(c));
    }
  P.step_key = {stages.front(), 0, rec.group};  // the group's step, from the first stage holding it
  return P;
}


}  // namespace

int64_t AutoSplitBytes(int64_t bytes_out, int ranks) {
  const int64_t share = bytes_out / std::max(1, ranks);
  return std::clamp<int64_t>(share / 4, int64_t{64} << 20, int64_t{1} << 30);
}

ConvertPlan MakeConvertPlan(const source::SourceIndex& L, const patterns::ModelPatterns& M, int ranks,
                            int64_t buffer_bytes, int64_t split_above, int64_t cut_above) {
  if (ranks < 1) throw Error("internal: plan for " + std::to_string(ranks) + " ranks");
  ConvertPlan plan;
  plan.ranks = ranks;
  std::map<std::string, const patterns::ParamPattern*> by_name;
  for (const auto& p : M.params) by_name[p.name] = &p;
  std::vector<std::string> failures;
  std::map<int, size_t> plan_of;  // layout index -> params index
  for (size_t k = 0; k < L.params.size(); ++k) {
    auto it = by_name.find(L.params[k].name);
    if (it == by_name.end()) {
      failures.push_back("parameter '" + L.params[k].name + "': no pattern could be resolved");
      continue;
    }
    try {
      plan_of[static_cast<int>(k)] = plan.params.size();
      plan.params.push_back(PlanParam(L, M, static_cast<int>(k), *it->second));
    } catch (const std::exception& e) {
      plan_of.erase(static_cast<int>(k));
      failures.push_back(e.what());
    }
  }
  // Fragments become pieces of their parameter's stream.
  for (const auto& fr : L.fragments) {
    auto it = plan_of.find(fr.param);
    if (it == plan_of.end()) continue;
    ParamPlan& P = plan.params[it->second];
    const source::ShardFile& f = L.files[fr.file];
    for (const auto& c : P.copies)
      if (c.pp == f.pp && c.tp == L.CopyTp(fr)) P.pieces.push_back({fr.file, fr.group, fr.src_start, fr.numel, c.stream_start + fr.dst_start});
  }
  for (auto& P : plan.params) {
    std::sort(P.pieces.begin(), P.pieces.end(), [](const Piece& a, const Piece& b) { return a.stream_start < b.stream_start; });
    int64_t at = 0;
    for (const auto& pc : P.pieces) {
      if (pc.stream_start != at) break;
      at += pc.numel;
    }
    if (at != P.stream_numel)
      failures.push_back("parameter '" + P.name + "': the optimizer files do not cover its elements exactly once");
  }
  if (!failures.empty()) {
    throw Error("cannot plan the conversion: " + failures.front() +
                (failures.size() > 1 ? " (and " + std::to_string(failures.size() - 1) + " more parameter(s) alike)" : ""));
  }

  int64_t bytes_out = 0;
  for (const auto& P : plan.params) bytes_out += 4 * P.full_numel * kStates;
  plan.split_above = split_above < 0 ? AutoSplitBytes(bytes_out, ranks) : split_above;
  plan.cut_above = cut_above < 0 ? AutoSplitBytes(bytes_out, ranks) : cut_above;
  AssignMappers(L, plan);

  // Reducers: (parameter, state) items, balanced by the bytes they receive and write, each on
  // the rank that maps most of its bytes while that rank's load stays within 5% of an even
  // share: bytes reduced where they are read go straight into place, with no shuffle.
  // Model-states files to carry: spread first (largest first), their read and written bytes the
  // loads the reducers start from.
  plan.file_carrier.assign(L.files.size(), -1);
  plan.carried_bytes.assign(ranks, 0);
  std::vector<int> carried;
  std::vector<int64_t> carried_weights;
  for (size_t f = 0; f < L.files.size(); ++f) {
    if (!L.files[f].carried) continue;
    std::error_code ec;
    auto size = fs::file_size(L.dir + "/" + L.files[f].name, ec);
    carried.push_back(static_cast<int>(f));
    carried_weights.push_back(ec ? 0 : static_cast<int64_t>(size));
  }
  std::vector<int64_t> start_load(ranks, 0);
  auto carriers = AssignLpt(carried_weights, ranks);
  for (size_t k = 0; k < carried.size(); ++k) {
    plan.file_carrier[carried[k]] = carriers[k];
    plan.carried_bytes[carriers[k]] += carried_weights[k];
    start_load[carriers[k]] += 2 * carried_weights[k];
  }

  // The items: every (parameter, state), a large one split by rows into parts.
  std::vector<Item> items;
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const ParamPlan& P = plan.params[p];
    const int64_t rows = P.full_shape.empty() ? 1 : P.full_shape[0], bytes = 4 * P.full_numel;
    int parts = 1;
    if (plan.split_above > 0 && bytes > plan.split_above && !P.full_shape.empty())
      parts = static_cast<int>(std::min<int64_t>({rows, ranks, (bytes + plan.split_above - 1) / plan.split_above}));
    for (int s = 0; s < kStates; ++s)
      for (int k = 0; k < parts; ++k) {
        Item it;
        it.param = static_cast<int>(p), it.state = static_cast<State>(s), it.part = k, it.parts = parts;
        const auto [r0, r1] = P.PartRows(k, parts);
        if (parts == 1) {
          it.out_numel = P.full_numel;
          it.segments = {{0, P.stream_numel}};
        } else {
          it.out_begin = r0 * P.RowNumel(), it.out_numel = (r1 - r0) * P.RowNumel();
          it.segments = P.RowSegments(r0, r1);
        }
        for (const auto& seg : it.segments) it.numel += seg.second;
        items.push_back(std::move(it));
      }
  }
  // Balanced by the bytes each item receives and writes; the elements each rank maps of it (the
  // same for the three states of a part) are its affinity.
  std::vector<int64_t> weights;
  std::map<std::pair<int, int>, std::vector<int64_t>> local;  // (param, part) -> elements per mapping rank
  for (const Item& it : items) {
    weights.push_back(4 * (it.numel + it.out_numel));
    auto& per = local[{it.param, it.part}];
    if (!per.empty()) continue;
    per.assign(ranks, 0);
    ForEachItemRun(plan.params[it.param], it, 0, it.numel,
                   [&](const Piece& pc, int64_t, int64_t n, int64_t) { per[pc.mapper] += n; });
  }
  auto bins = AssignLocal(weights, start_load, [&](size_t k, int r) { return local.at({items[k].param, items[k].part})[r]; });
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  plan.work.assign(ranks, {});
  plan.work_numel.assign(ranks, 0);
  plan.reduced_bytes.assign(ranks, 0);
  for (size_t k : order) {
    const int r = bins[k];
    Item it = items[k];
    if (it.part == 0) plan.params[it.param].reducer[static_cast<int>(it.state)] = r;
    it.work_start = plan.work_numel[r];
    plan.work_numel[r] += it.numel;
    plan.reduced_bytes[r] += 4 * it.out_numel;
    plan.work[r].push_back(std::move(it));
  }

  plan.buffer_bytes = buffer_bytes;
  plan.ChooseRounds();
  return plan;
}

int64_t ConvertPlan::MaxInFlight(int64_t chunk, int64_t max_cells) const {
  int64_t most_rounds = 0;
  for (int r = 0; r < ranks; ++r) most_rounds = std::max(most_rounds, (work_numel[r] + chunk - 1) / chunk);
  if (most_rounds > max_cells / ranks) return -1;
  std::vector<int64_t> bytes(static_cast<size_t>(ranks * most_rounds), 0);  // [rank * most_rounds + round]
  for (int r = 0; r < ranks; ++r)
    for (const Item& it : work[r])
      ForEachItemRun(params[it.param], it, 0, it.numel, [&](const Piece& pc, int64_t off, int64_t n, int64_t rel) {
        if (!Shuffled(r, it, pc, off)) return;
        const int m = pc.mapper;
        for (int64_t at = it.work_start + rel, end = at + n; at < end;) {
          const int64_t k = at / chunk, upto = std::min(end, (k + 1) * chunk);
          bytes[m * most_rounds + k] += 4 * (upto - at);  // sent by the mapper
          bytes[r * most_rounds + k] += 4 * (upto - at);  // received by the reducer
          at = upto;
        }
      });
  return bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
}

void ConvertPlan::ChooseRounds() {
  // Always within the buffer: no rank sends more than a chunk to each reducer, nor receives more than one.
  int64_t best = std::max<int64_t>(256, buffer_bytes / (4 * (ranks + 1)));
  // The largest chunk up to the whole buffer whose rounds, counted, stay within it (by bisection; in
  // flight grows with the chunk but not strictly, so a chunk is kept only as counted).
  for (int64_t lo = best, hi = std::max(best, buffer_bytes / 4); hi - lo > std::max<int64_t>(256, lo / 64);) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t in_flight = MaxInFlight(mid);
    if (in_flight >= 0 && in_flight <= buffer_bytes) lo = best = mid;
    else hi = mid;
  }
  chunk_elems = best;
  rounds = 0;
  for (int r = 0; r < ranks; ++r) rounds = std::max(rounds, (work_numel[r] + chunk_elems - 1) / chunk_elems);
}

void ConvertPlan::SkipDone(const std::vector<char>& done) {
  for (int r = 0; r < ranks; ++r) {
    std::vector<Item> kept;
    work_numel[r] = 0;
    reduced_bytes[r] = 0;
    for (Item& it : work[r]) {
      if (done[it.param * kStates + static_cast<int>(it.state)]) continue;
      it.work_start = work_numel[r];
      work_numel[r] += it.numel;
      reduced_bytes[r] += 4 * it.out_numel;
      kept.push_back(std::move(it));
    }
    work[r] = std::move(kept);
  }
  ChooseRounds();
}

int64_t ParamPlan::RowNumel() const {
  int64_t n = 1;
  for (size_t k = 1; k < full_shape.size(); ++k) n *= full_shape[k];
  return n;
}

std::vector<std::pair<int64_t, int64_t>> ParamPlan::RowSegments(int64_t row_begin, int64_t row_end) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t inner = RowNumel();  // dimensions past 0 are never padded: a copy's row is as long
  for (const Copy& c : copies) {
    std::vector<std::pair<int64_t, int64_t>> mine;
    if (c.split_dim != 0) {  // whole rows of the joined tensor, in the same order
      const int64_t local_inner = c.shape.empty() || c.shape[0] == 0 ? 1 : c.numel / c.shape[0];
      mine.push_back({c.stream_start + row_begin * local_inner, (row_end - row_begin) * local_inner});
    } else {
      for (const Block& b : c.blocks) {
        const int64_t lo = std::max(row_begin, b.joined_start), hi = std::min(row_end, b.joined_start + b.length);
        if (lo < hi) mine.push_back({c.stream_start + (b.local_start + lo - b.joined_start) * inner, (hi - lo) * inner});
      }
      std::sort(mine.begin(), mine.end());
    }
    for (const auto& seg : mine) {
      if (seg.second == 0) continue;
      if (!out.empty() && out.back().first + out.back().second == seg.first) out.back().second += seg.second;
      else out.push_back(seg);
    }
  }
  return out;
}

const Copy& ParamPlan::CopyAt(int64_t stream_pos) const {
  auto it = std::upper_bound(copies.begin(), copies.end(), stream_pos,
                             [](int64_t s, const Copy& c) { return s < c.stream_start; });
  if (it == copies.begin()) throw Error("internal: stream element " + std::to_string(stream_pos) + " of '" + name + "' precedes its copies");
  return *(it - 1);
}

double ConvertPlan::Imbalance() const {
  int64_t total = 0, most = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t b = reduced_bytes[r] + (carried_bytes.empty() ? 0 : carried_bytes[r]);
    total += b, most = std::max(most, b);
  }
  return total ? static_cast<double>(most) * ranks / static_cast<double>(total) : 1.0;
}

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
    for (int s = 0; s < kStates; ++s) {
      const auto& v = part_ranks[p][s];
      red[std::string(StateName(static_cast<State>(s)))] = v.size() > 1 ? nlohmann::json(v) : nlohmann::json(P.reducer[s]);
    }
    params.push_back({{"name", P.name}, {"shape", P.full_shape}, {"copies", P.copies.size()},
                      {"fragments", P.pieces.size()}, {"bytes", 4 * P.full_numel * kStates}, {"reducers", red}});
  }
  j["params"] = params;
  return j;
}

std::string ConvertPlan::ToText() const {
  std::ostringstream o;
  int64_t in = 0, out = 0;
  for (int r = 0; r < ranks; ++r) in += mapped_bytes[r], out += reduced_bytes[r];
  o << "plan: " << params.size() << " parameters x " << kStates << " states on " << ranks << " rank(s); reads "
    << HumanBytes(static_cast<double>(in)) << ", writes " << HumanBytes(static_cast<double>(out)) << " of tensors\n";
  int split = 0;  // (parameter, state) items written in parts
  for (const auto& w : work)
    for (const Item& it : w) split += it.split() && it.part == 0;
  o << "items: " << params.size() * kStates << " (parameter, state); ";
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

namespace {

int64_t Product(const std::vector<int64_t>& v, size_t from) {
  int64_t p = 1;
  for (size_t k = from; k < v.size(); ++k) p *= v[k];
  return p;
}

// Row-major elements [a, b) of the sub-tensor at dimensions [dim, ...) (the leading ones fixed in
// `start`), whose first element has flat index `origin`, as hyperslabs: a partial row, whole rows,
// a partial row.
void LocalSlabs(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& start, std::vector<int64_t>& count,
                int64_t a, int64_t b, int64_t origin, const SlabFn& emit) {
  if (a >= b) return;
  if (dim == shape.size()) return emit(start, count, origin + a);  // one element
  const int64_t inner = Product(shape, dim + 1);
  auto partial_row = [&](int64_t row, int64_t lo, int64_t hi) {
    start[dim] = row, count[dim] = 1;
    LocalSlabs(shape, dim + 1, start, count, lo - row * inner, hi - row * inner, origin + row * inner, emit);
  };
  if (a % inner != 0 || b - a < inner) {
    const int64_t row = a / inner, stop = std::min(b, (row + 1) * inner);
    partial_row(row, a, stop);
    a = stop;
  }
  if (const int64_t rows = (b - a) / inner; rows > 0) {
    start[dim] = a / inner, count[dim] = rows;
    for (size_t k = dim + 1; k < shape.size(); ++k) start[k] = 0, count[k] = shape[k];
    emit(start, count, origin + a);
    a += rows * inner;
  }
  if (a < b) partial_row(a / inner, a, b);
}

// A copy-local slab in joined coordinates: split where it crosses blocks of the split dimension,
// and, when a dimension before the split one ranges too, row by row along that dimension first
// (so that every slab stays a run of consecutive copy-local elements).
void MapSlab(const Copy& c, std::vector<int64_t> start, std::vector<int64_t> count, int64_t local, const SlabFn& fn) {
  const size_t d = static_cast<size_t>(c.split_dim);
  const int64_t s = start[d], n = count[d];
  const Block* within = nullptr;
  for (const auto& blk : c.blocks)
    if (s >= blk.local_start && s + n <= blk.local_start + blk.length) within = &blk;
  if (within) {
    start[d] = within->joined_start + (s - within->local_start);
    return fn(start, count, local);
  }
  for (size_t k = 0; k < d; ++k)
    if (count[k] > 1) {
      const int64_t step = Product(count, k + 1), first = start[k], rows = count[k];
      count[k] = 1;
      for (int64_t i = 0; i < rows; ++i) {
        start[k] = first + i;
        MapSlab(c, start, count, local + i * step, fn);
      }
      return;
    }
  const int64_t step = Product(count, d + 1);
  for (const auto& blk : c.blocks) {
    const int64_t lo = std::max(s, blk.local_start), hi = std::min(s + n, blk.local_start + blk.length);
    if (lo >= hi) continue;
    std::vector<int64_t> st = start, ct = count;
    st[d] = blk.joined_start + (lo - blk.local_start), ct[d] = hi - lo;
    fn(st, ct, local + (lo - s) * step);
  }
}

}  // namespace

void ForEachJoinedSlab(const Copy& copy, int64_t begin, int64_t end, const SlabFn& fn) {
  std::vector<int64_t> start(copy.shape.size(), 0), count(copy.shape.size(), 1);
  if (copy.split_dim < 0) return LocalSlabs(copy.shape, 0, start, count, begin, end, 0, fn);
  LocalSlabs(copy.shape, 0, start, count, begin, end, 0,
             [&](const std::vector<int64_t>& st, const std::vector<int64_t>& ct, int64_t local) { MapSlab(copy, st, ct, local, fn); });
}

}  // namespace ucp::plan
