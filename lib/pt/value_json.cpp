#include "pt/value_json.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ucp::pt {
namespace {

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

nlohmann::json Sequence(const std::vector<ValuePtr>& items, size_t max, int depth);

nlohmann::json Canonical(const Value& v, size_t max, int depth) {
  if (depth > 1000) throw Error("value nests deeper than 1000 levels");
  using K = Value::Kind;
  switch (v.kind) {
    case K::None: return nullptr;
    case K::Bool: return v.b;
    case K::Int: return v.i;
    case K::BigInt: return {{"bigint", Hex(v.s)}};
    case K::Float: {
      uint64_t bits;
      std::memcpy(&bits, &v.f, 8);
      char buf[20];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
      return {{"float", buf}};
    }
    case K::Str: return v.s;
    case K::Bytes: return {{"bytes", Hex(v.s)}};
    case K::List: return {{"list", Sequence(v.items, max, depth)}};
    case K::Tuple: return {{"tuple", Sequence(v.items, max, depth)}};
    case K::Set: {
      auto items = Sequence(v.items, max, depth);
      std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.dump() < b.dump(); });
      return {{"set", items}};
    }
    case K::Dict: {
      auto out = nlohmann::json::array();
      for (const auto& it : v.dict.items())
        out.push_back({Canonical(*it.key, max, depth + 1), Canonical(*it.value, max, depth + 1)});
      return {{"dict", out}};
    }
    case K::Global: return {{"global", v.QualifiedName()}};
    case K::Object: {
      nlohmann::json o = {{"object", v.QualifiedName()}};
      o["args"] = v.args ? Sequence(v.args->items, max, depth) : nlohmann::json::array();
      o["state"] = v.state ? Canonical(*v.state, max, depth + 1) : nlohmann::json(nullptr);
      if (!v.items.empty()) o["items"] = Sequence(v.items, max, depth);
      if (v.dict.size() > 0) {
        auto d = nlohmann::json::array();
        for (const auto& it : v.dict.items())
          d.push_back({Canonical(*it.key, max, depth + 1), Canonical(*it.value, max, depth + 1)});
        o["dict_items"] = d;
      }
      return o;
    }
    case K::Tensor: {
      const TensorView& t = *v.tensor;
      nlohmann::json o = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}};
      if (t.nbytes() <= max) o["hex"] = Hex(TensorBytes(t));
      return {{"tensor", o}};
    }
    case K::Storage: return {{"storage", v.storage->key}};
  }
  return nullptr;
}

nlohmann::json Sequence(const std::vector<ValuePtr>& items, size_t max, int depth) {
  auto out = nlohmann::json::array();
  for (const auto& e : items) out.push_back(Canonical(*e, max, depth + 1));
  return out;
}

}  // namespace

std::string TensorBytes(const TensorView& t) {
  size_t es = ElementSize(t.dtype);
  std::string out;
  out.reserve(t.nbytes());
  uint64_t n = t.numel();
  std::vector<int64_t> idx(t.shape.size(), 0);
  for (uint64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * t.stride[k];
    out.append(reinterpret_cast<const char*>(t.data() + off * es), es);
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < t.shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

nlohmann::json CanonicalJson(const Value& value, size_t max_tensor_bytes) {
  return Canonical(value, max_tensor_bytes, 0);
}

}  // namespace ucp::pt
