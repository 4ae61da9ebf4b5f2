#include "plan/convert_plan.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <queue>

#include "core/error.h"

namespace ucp::plan {
namespace fs = std::filesystem;

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

int64_t AutoSplitBytes(int64_t bytes_out, int ranks) {
  const int64_t share = bytes_out / std::max(1, ranks);
  return std::clamp<int64_t>(share / 4, int64_t{64} << 20, int64_t{1} << 30);
}

namespace {

// Every parameter's plan and its pieces (the fragments, as runs of its stream), checked to tile the
// stream exactly. Throws with the first failure and the count of the rest.
void PlanParams(const source::SourceIndex& L, const patterns::ModelPatterns& M, ConvertPlan& plan) {
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
}

// Model-states files to carry: spread first (largest first), their read and written bytes the
// loads the reducers start from, which this returns per rank.
std::vector<int64_t> AssignCarriers(const source::SourceIndex& L, ConvertPlan& plan) {
  plan.file_carrier.assign(L.files.size(), -1);
  plan.carried_bytes.assign(plan.ranks, 0);
  std::vector<int> carried;
  std::vector<int64_t> carried_weights;
  for (size_t f = 0; f < L.files.size(); ++f) {
    if (!L.files[f].carried) continue;
    std::error_code ec;
    auto size = fs::file_size(L.dir + "/" + L.files[f].name, ec);
    carried.push_back(static_cast<int>(f));
    carried_weights.push_back(ec ? 0 : static_cast<int64_t>(size));
  }
  std::vector<int64_t> start_load(plan.ranks, 0);
  auto carriers = AssignLpt(carried_weights, plan.ranks);
  for (size_t k = 0; k < carried.size(); ++k) {
    plan.file_carrier[carried[k]] = carriers[k];
    plan.carried_bytes[carriers[k]] += carried_weights[k];
    start_load[carriers[k]] += 2 * carried_weights[k];
  }
  return start_load;
}

// The items: every (parameter, state), a large one split by rows into parts.
std::vector<Item> MakeItems(const ConvertPlan& plan) {
  std::vector<Item> items;
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const ParamPlan& P = plan.params[p];
    const int64_t rows = P.full_shape.empty() ? 1 : P.full_shape[0], bytes = 4 * P.full_numel;
    int parts = 1;
    if (plan.split_above > 0 && bytes > plan.split_above && !P.full_shape.empty())
      parts = static_cast<int>(std::min<int64_t>({rows, plan.ranks, (bytes + plan.split_above - 1) / plan.split_above}));
    for (int s = 0; s < plan.states; ++s)
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
  return items;
}

// Reducers: (parameter, state) items, balanced by the bytes they receive and write, each on
// the rank that maps most of its bytes while that rank's load stays within 5% of an even
// share: bytes reduced where they are read go straight into place, with no shuffle.
void AssignReducers(std::vector<Item> items, const std::vector<int64_t>& start_load, ConvertPlan& plan) {
  const int ranks = plan.ranks;
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
}

}  // namespace

ConvertPlan MakeConvertPlan(const source::SourceIndex& L, const patterns::ModelPatterns& M, int ranks,
                            int64_t buffer_bytes, int64_t split_above, int64_t cut_above, int states) {
  if (ranks < 1) throw Error("internal: plan for " + std::to_string(ranks) + " ranks");
  if (states != 1 && states != kStates) throw Error("internal: a plan of " + std::to_string(states) + " states");
  ConvertPlan plan;
  plan.ranks = ranks;
  plan.states = states;
  PlanParams(L, M, plan);
  int64_t bytes_out = 0;
  for (const auto& P : plan.params) bytes_out += 4 * P.full_numel * plan.states;
  plan.split_above = split_above < 0 ? AutoSplitBytes(bytes_out, ranks) : split_above;
  plan.cut_above = cut_above < 0 ? AutoSplitBytes(bytes_out, ranks) : cut_above;
  AssignMappers(L, plan);
  const std::vector<int64_t> start_load = AssignCarriers(L, plan);
  AssignReducers(MakeItems(plan), start_load, plan);
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

double ConvertPlan::Imbalance() const {
  int64_t total = 0, most = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t b = reduced_bytes[r] + (carried_bytes.empty() ? 0 : carried_bytes[r]);
    total += b, most = std::max(most, b);
  }
  return total ? static_cast<double>(most) * ranks / static_cast<double>(total) : 1.0;
}

}  // namespace ucp::plan
