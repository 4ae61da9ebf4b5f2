#include "layout/target.h"

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <fstream>
#include <limits>
#include <regex>
#include <set>

#include "core/error.h"

namespace ucp::reshard {

std::string TargetLayout::Degrees() const {
  return "dp=" + std::to_string(dp) + (Sp() > 1 ? " sp=" + std::to_string(sp) : "") + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " ZeRO-" +
         std::to_string(zero_stage) + (ep > 0 ? " ep=" + std::to_string(ep) : "");
}

std::string TargetLayout::Describe(bool ddp_bf16_wrapper) const {
  const char* optimizer = !bf16_optimizer() ? "" : ddp_bf16_wrapper ? " (DeepSpeed's DDP bf16 wrapper)" : " (BF16 optimizer)";
  return Degrees() + " " + dtype + optimizer +
         (model.empty() ? "" : model == "plain" ? ", not a pipeline module" : ", pipeline module");
}

nlohmann::json TargetLayout::ToJson() const {
  nlohmann::json j = {{"layout_version", 1}, {"dp", dp}, {"tp", tp}, {"pp", pp}, {"zero_stage", zero_stage},
                      {"dtype", dtype}, {"partition_method", partition_method}};
  if (vocab_divisible_by > 0) j["make_vocab_size_divisible_by"] = vocab_divisible_by;
  if (sp > 0) j["sp"] = sp;
  if (ep > 0) j["ep"] = ep;
  if (!model.empty()) j["model"] = model;
  if (!grad_accum_dtype.empty()) j["grad_accum_dtype"] = grad_accum_dtype;
  if (!ds_version.empty()) j["ds_version"] = ds_version;
  return j;
}

bool IsReleaseVersion(const std::string& v) {
  static const std::regex release(R"(\d+\.\d+(\.\d+)?)");
  return std::regex_match(v, release);
}

bool ReleaseBefore(const std::string& v, int major, int minor, int patch) {
  int a = 0, b = 0, c = 0;
  if (std::sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c) < 2) return false;
  return std::make_tuple(a, b, c) < std::make_tuple(major, minor, patch);
}

std::string GradAccumDtypeOf(const std::string& configured, const std::string& optimizer, int zero_stage,
                             const std::string& dtype) {
  if (!configured.empty()) return configured;
  return optimizer == "bf16_optimizer" && zero_stage == 1 ? "fp32" : dtype;
}

std::string ResolvedDtype(const TargetLayout& t, const nlohmann::json& source) {
  if (!t.dtype.empty()) return t.dtype;
  const std::string d = source.is_object() ? source.value("dtype", "") : "";
  if (d != "fp32" && d != "bf16" && d != "fp16")
    throw Error("the checkpoint does not record the dtype its job trained in: give --dtype fp32, bf16 or fp16");
  return d;
}

std::string ResolvedGradAccumDtype(const TargetLayout& t, const nlohmann::json& source) {
  if (!t.grad_accum_dtype.empty()) return t.grad_accum_dtype;
  return GradAccumDtypeOf(source.value("grad_accum_dtype", ""), source.value("optimizer", ""),
                          source.value("zero_stage", -1), t.dtype);
}

std::string ResolvedModel(const TargetLayout& t, const std::string& source_naming) {
  if (!t.model.empty()) return t.model;
  return t.zero_stage == 3 || t.Sp() > 1 ? "plain" : t.pp > 1 ? "pipe" : source_naming;
}

TargetLayout ReadLayoutFile(const std::string& path, TargetLayout base, std::vector<std::string>* given) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot read the layout file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not JSON: " + e.what());
  }
  return ApplyLayout(j, std::move(base), path, given);
}

std::vector<std::string> MissingLayoutKeys(const std::vector<std::string>& given) {
  std::vector<std::string> missing;
  for (const char* key : {"dp", "tp", "pp", "zero_stage"})
    if (std::find(given.begin(), given.end(), key) == given.end()) missing.push_back(key);
  return missing;
}

TargetLayout ApplyLayout(const nlohmann::json& j, TargetLayout t, const std::string& path, std::vector<std::string>* given) {
  if (!j.is_object()) throw Error(path + ": a layout is a JSON object (schemas/layout.schema.json)");
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const nlohmann::json& v = item.value();
    auto bad = [&](const std::string& want) {
      return Error(path + ": '" + key + "' must be " + want + ", not " + v.dump());
    };
    auto dtype = [&]() -> std::string {
      static const std::set<std::string> dtypes = {"fp16", "bf16", "fp32"};
      if (!v.is_string() || !dtypes.count(v.get<std::string>())) throw bad("\"fp16\", \"bf16\" or \"fp32\"");
      return v.get<std::string>();
    };
    auto positive = [&]() -> int {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20)) throw bad("a positive integer");
      return v.get<int>();
    };
    if (key == "$schema") continue;
    if (key == "layout_version") {
      if (v != 1) throw bad("1 (this ucp reads layout version 1)");
      continue;
    }
    if (key == "dp") t.dp = positive();
    else if (key == "tp") t.tp = positive();
    else if (key == "pp") t.pp = positive();
    else if (key == "sp") t.sp = positive();
    else if (key == "ep") t.ep = positive();
    else if (key == "make_vocab_size_divisible_by") t.vocab_divisible_by = positive();
    else if (key == "zero_stage") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 3) throw bad("0, 1, 2 or 3");
      t.zero_stage = v.get<int>();
    } else if (key == "dtype") {
      t.dtype = dtype();
    } else if (key == "grad_accum_dtype") {
      t.grad_accum_dtype = dtype();
    } else if (key == "ds_version") {
      if (!v.is_string() || !IsReleaseVersion(v.get<std::string>())) throw bad("a DeepSpeed release such as \"0.14.5\"");
      t.ds_version = v.get<std::string>();
    } else if (key == "model") {
      if (!v.is_string() || (v != "pipe" && v != "plain")) throw bad("\"pipe\" (a PipelineModule) or \"plain\" (not one)");
      t.model = v.get<std::string>();
    } else if (key == "partition_method") {
      if (v.is_string() && !v.get<std::string>().empty()) {
        t.partition_method = v.get<std::string>();
      } else if (v.is_array() && v.size() >= 2) {
        std::string joined;
        for (const auto& b : v) {
          if (!b.is_number_integer() || b.get<int64_t>() < 0) throw bad("a method name or a list of layer-spec boundaries");
          joined += (joined.empty() ? "" : ",") + std::to_string(b.get<int64_t>());
        }
        t.partition_method = joined;
      } else {
        throw bad("a method name or a list of layer-spec boundaries");
      }
    } else {
      throw Error(path + ": unknown key '" + key + "' (schemas/layout.schema.json lists dp, tp, pp, zero_stage, dtype, "
                  "partition_method, make_vocab_size_divisible_by, model, sp, ep, grad_accum_dtype, ds_version)");
    }
    given->push_back(key);
  }
  return t;
}

std::vector<int> PartitionUniform(int num_items, int num_parts) {
  std::vector<int> parts(num_parts + 1, 0);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts, residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk + std::min(p, residual);  // the first parts get one more
  return parts;
}

// The linear partition problem by dynamic programming, as DeepSpeed solves it: minimise the spread
// (largest part minus smallest); on ties the latest split wins (its `>=`), and infinities behave
// as numpy's do.
std::vector<int> PartitionBalanced(const std::vector<double>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size()), m = num_parts;
  if (n <= m) return PartitionUniform(n, m);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> dp_max(n + 1, std::vector<double>(m + 1, inf)), dp_min = dp_max, dp_cost = dp_max;
  std::vector<std::vector<int>> position(n + 1, std::vector<int>(m + 1, 0));
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  dp_max[0][0] = 0;
  dp_cost[0][0] = 0;
  for (int i = 1; i <= n; ++i)
    for (int j = 1; j <= std::min(i, m); ++j)
      for (int k = 0; k < i; ++k) {
        double part = prefix[i] - prefix[k];
        double max_sum = std::max(dp_max[k][j - 1], part), min_sum = std::min(dp_min[k][j - 1], part);
        double cost = max_sum - min_sum;  // inf - inf is NaN, and NaN compares false, as in numpy
        if (dp_cost[i][j] >= cost) {
          dp_cost[i][j] = cost;
          dp_max[i][j] = max_sum;
          dp_min[i][j] = min_sum;
          position[i][j] = k;
        }
      }
  std::vector<int> parts = {n};
  for (int j = m; j >= 1; --j) parts.push_back(position[parts.back()][j]);
  return {parts.rbegin(), parts.rend()};
}

}  // namespace ucp::reshard
