// A parameter's plan (ParamPlan): its copies as they join into the atomic tensor, the blocks of a
// split dimension (sub-parameters included), and the runs of its stream that land in given rows.
#include <algorithm>

#include "core/error.h"
#include "plan/convert_plan.h"

namespace ucp::plan {
using patterns::Pattern;

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

}  // namespace

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

}  // namespace ucp::plan
