#include "safetensors/read.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "pt/low_precision.h"

namespace ucp::safetensors {
using nlohmann::json;

bool SafetensorsDType(std::string_view name, pt::DType* out) {
  if (name == "F32") *out = pt::DType::F32;
  else if (name == "BF16") *out = pt::DType::BF16;
  else if (name == "F16") *out = pt::DType::F16;
  else return false;
  return true;
}

namespace {

uint64_t NonNegative(const json& v, const std::string& where, const char* what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    throw Error(where + ": " + what + " " + v.dump() + " is no non-negative integer");
  return v.get<uint64_t>();
}

// One tensor's entry: dtype, shape, data_offsets, each checked alone.
StTensor TensorEntry(const std::string& name, const json& e, const std::string& path) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    throw Error(where + ": not an object with dtype, shape and data_offsets");
  StTensor t;
  t.name = name;
  const json& dtype = e.at("dtype");
  if (!dtype.is_string() || !SafetensorsDType(dtype.get<std::string>(), &t.dtype))
    throw Error(where + ": dtype " + dtype.dump() + ": ucp reads F32, BF16 and F16 weights only");
  const json& shape = e.at("shape");
  const json& offsets = e.at("data_offsets");
  if (!shape.is_array() || shape.size() > 8) throw Error(where + ": shape " + shape.dump() + " is no list of at most 8 sizes");
  for (const auto& d : shape) t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(NonNegative(d, where, "size"), uint64_t{1} << 62)));
  if (!offsets.is_array() || offsets.size() != 2) throw Error(where + ": data_offsets " + offsets.dump() + " is no [begin, end]");
  t.begin = NonNegative(offsets[0], where, "data_offsets begin");
  t.end = NonNegative(offsets[1], where, "data_offsets end");
  const int64_t numel = WithContext(where, [&] { return pt::CheckedNumel(t.shape); });
  if (t.end < t.begin || t.end - t.begin != static_cast<uint64_t>(numel) * pt::ElementSize(t.dtype))
    throw Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] span " +
                (t.end < t.begin ? std::string("backwards") : std::to_string(t.end - t.begin) + " bytes") + ", but shape " +
                pt::ShapeString(t.shape) + " of " + dtype.get<std::string>() + " is " +
                std::to_string(static_cast<uint64_t>(numel) * pt::ElementSize(t.dtype)) + " bytes");
  return t;
}

// The spans tile the data [0, size) exactly, in offset order.
void CheckTiling(std::vector<StTensor>& tensors, uint64_t size, const std::string& path) {
  std::sort(tensors.begin(), tensors.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const StTensor& t : tensors) {
    if (t.begin < at)
      throw Error(path + ": tensor '" + t.name + "' at bytes [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                  ") overlaps the tensor before it (which ends at " + std::to_string(at) + ")");
    if (t.begin > at)
      throw Error(path + ": a hole of " + std::to_string(t.begin - at) + " bytes before tensor '" + t.name + "' (at " +
                  std::to_string(at) + "): the format's tensors cover the data without gaps");
    at = t.end;
  }
  if (at != size)
    throw Error(path + ": the tensors end at byte " + std::to_string(at) + " of the data, but the file holds " +
                std::to_string(size) + (at < size ? " (bytes after the last tensor)" : " (truncated)"));
}

}  // namespace

StHeader ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size, const std::string& path) {
  if (file_size < 8 || prefix.size() < 8) throw Error(path + ": " + std::to_string(file_size) + " bytes: too short for a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[static_cast<size_t>(i)]);
  if (n > kMaxSafetensorsHeader)
    throw Error(path + ": header length " + std::to_string(n) + " is past the format's limit of " +
                std::to_string(kMaxSafetensorsHeader) + " bytes: not a safetensors file, or a damaged one");
  if (n > file_size - 8 || prefix.size() < 8 + n)
    throw Error(path + ": header length " + std::to_string(n) + ", but the file has " + std::to_string(file_size - 8) +
                " bytes after the length (truncated?)");
  json h = json::parse(prefix.substr(8, n), nullptr, false);
  if (h.is_discarded() || !h.is_object()) throw Error(path + ": the header is no JSON object");
  StHeader out;
  out.data_start = 8 + n;
  for (const auto& [key, value] : h.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw Error(path + ": __metadata__ is no object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw Error(path + ": __metadata__ '" + k + "' is " + v.dump() + ", not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.tensors.push_back(TensorEntry(key, value, path));
  }
  CheckTiling(out.tensors, file_size - out.data_start, path);
  return out;
}

StIndex ParseSafetensorsIndex(std::string_view text, const std::string& path) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path + ": no JSON object");
  if (!j.contains("weight_map") || !j.at("weight_map").is_object()) throw Error(path + ": no weight_map object");
  StIndex out;
  for (const auto& [tensor, file] : j.at("weight_map").items()) {
    if (!file.is_string()) throw Error(path + ": weight_map '" + tensor + "' is " + file.dump() + ", not a file name");
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f.starts_with(".") || !f.ends_with(".safetensors"))
      throw Error(path + ": weight_map '" + tensor + "' names '" + f + "': not a .safetensors file beside the index");
    out.weight_map[tensor] = f;
    out.files.push_back(f);
  }
  std::sort(out.files.begin(), out.files.end());
  out.files.erase(std::unique(out.files.begin(), out.files.end()), out.files.end());
  if (j.contains("metadata") && j.at("metadata").is_object() && j.at("metadata").contains("total_size"))
    out.total_size = static_cast<int64_t>(
        std::min<uint64_t>(NonNegative(j.at("metadata").at("total_size"), path, "metadata.total_size"), uint64_t{1} << 62));
  return out;
}

namespace {

StModel::File OpenOne(const std::string& dir, const std::string& name) {
  StModel::File f;
  f.name = name;
  f.map = MappedFile::Open(dir + "/" + name, /*keep_read_fd=*/true);  // read in slabs; a model has few files
  const auto bytes = f.map->bytes();
  const std::string_view all(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  f.header = ParseSafetensorsHeader(all, bytes.size(), dir + "/" + name);
  return f;
}

// The index against the files: every tensor in the file it names, none missing, none extra, and
// total_size the tensors' bytes.
void CheckAgainstIndex(const StModel& m, const StIndex& index, const std::string& index_path) {
  uint64_t total = 0;
  for (const auto& f : m.files)
    for (const auto& t : f.header.tensors) {
      total += t.end - t.begin;
      auto it = index.weight_map.find(t.name);
      if (it == index.weight_map.end())
        throw Error(m.dir + "/" + f.name + ": tensor '" + t.name + "' is not in " + index_path + "'s weight_map");
      if (it->second != f.name)
        throw Error(m.dir + "/" + f.name + ": tensor '" + t.name + "' is here, but " + index_path + " puts it in " + it->second);
    }
  for (const auto& [tensor, file] : index.weight_map)
    if (!m.where.count(tensor)) throw Error(index_path + ": weight_map puts '" + tensor + "' in " + file + ", which does not hold it");
  if (index.total_size >= 0 && static_cast<uint64_t>(index.total_size) != total)
    throw Error(index_path + ": metadata.total_size " + std::to_string(index.total_size) + ", but the files' tensors hold " +
                std::to_string(total) + " bytes");
}

}  // namespace

StModel OpenSafetensorsModel(const std::string& dir) {
  StModel m;
  m.dir = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::error_code ec;
  StIndex index;
  if (std::filesystem::exists(index_path, ec)) {
    m.sharded = true;
    const auto text = ReadWholeFile(index_path);
    if (!text) throw Error(index_path + ": cannot read it");
    index = ParseSafetensorsIndex(*text, index_path);
    if (index.files.empty()) throw Error(index_path + ": weight_map names no file");
    for (const auto& name : index.files) m.files.push_back(OpenOne(dir, name));
  } else {
    m.files.push_back(OpenOne(dir, "model.safetensors"));
  }
  for (size_t f = 0; f < m.files.size(); ++f)
    for (size_t t = 0; t < m.files[f].header.tensors.size(); ++t) {
      const std::string& name = m.files[f].header.tensors[t].name;
      if (m.where.count(name))
        throw Error(dir + "/" + m.files[f].name + ": tensor '" + name + "' is in " + m.files[m.where[name].first].name + " too");
      m.where[name] = {static_cast<int>(f), static_cast<int>(t)};
    }
  if (m.sharded) CheckAgainstIndex(m, index, index_path);
  return m;
}

const StTensor& StModel::Tensor(const std::string& name) const {
  auto it = where.find(name);
  if (it == where.end()) throw Error(dir + ": no safetensors file holds tensor '" + name + "'");
  return files[it->second.first].header.tensors[it->second.second];
}

void StModel::ReadFp32(const std::string& name, float* dst) const {
  const auto& [fi, ti] = where.at(name);
  const File& f = files[fi];
  const StTensor& t = f.header.tensors[ti];
  const size_t n = (t.end - t.begin) / pt::ElementSize(t.dtype);
  const uint64_t at = f.header.data_start + t.begin;
  if (t.dtype == pt::DType::F32) {
    f.map->ReadAt(at, t.end - t.begin, dst);
    return;
  }
  // 16-bit values read and widened a slab at a time: the slab stays in the cache between the two,
  // and memory beside dst is the slab's, not a second tensor.
  constexpr size_t kSlab = size_t{1} << 19;  // elements: 1 MiB of 16-bit values
  std::vector<uint8_t> half(2 * std::min(n, kSlab));
  for (size_t done = 0; done < n; done += kSlab) {
    const size_t k = std::min(kSlab, n - done);
    f.map->ReadAt(at + 2 * done, 2 * k, half.data());
    pt::ToFp32(half.data(), t.dtype, k, dst + done);
  }
}

}  // namespace ucp::safetensors
