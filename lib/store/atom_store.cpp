// The store table and what both stores share: the manifest's parameters, slab checks, chunking.
#include "store/atom_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "core/mapped_file.h"
#include "core/xxhash64.h"
#include "store/universal_folder.h"

namespace ucp::store {

namespace {

// FileRecord::Mismatch of a mapped file, its bytes hashed through pread(2) in 16 MiB runs rather than
// by faulting the mapping in: a file of gigabytes (ZeRO-3's carried optimizer state) is checked without
// becoming resident in this process at once (peak RSS) and faster (MappedFile::ReadAt). A record in parts
// hashes each part from the mapping, as before.
std::string MismatchOf(const FileRecord& r, const MappedFile& file) {
  if (!r.parts.empty() || file.size() != r.bytes) return r.Mismatch(file.bytes());
  XxHash64 hash;
  std::vector<uint8_t> run(std::min<size_t>(file.size(), size_t{16} << 20));
  for (uint64_t at = 0; at < file.size(); at += run.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(run.size(), file.size() - at));
    file.ReadAt(at, n, run.data());
    hash.Update(run.data(), n);
  }
  const uint64_t digest = hash.Digest();
  return digest == r.xxh64 ? "" : "XXH64 " + HexDigest(digest) + ", the manifest says " + HexDigest(r.xxh64);
}

// The one table of stores: name -> reader and writer factories.
struct StoreEntry {
  StoreKind kind;
  const char* name;
  const char* description;
  std::unique_ptr<AtomReader> (*open)(const std::string&, nlohmann::json);
  std::unique_ptr<AtomWriter> (*create)(const std::string&, std::vector<AtomSpec>, shuffle::Comm&);
};
const StoreEntry kStores[] = {
    {StoreKind::Pt, "pt",
     "DeepSpeed's universal checkpoint layout, zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt, which its "
     "load_universal reads",
     OpenPtReader, CreatePtWriter},
    {StoreKind::Hdf5, "hdf5", "one atoms.h5 (schemas/atoms-h5.schema.json), written in parallel through MPI-IO",
     OpenH5Reader, CreateH5Writer},
    {StoreKind::Partitions, "partitions",
     "a run's scratch only (ucp-reshard from a training root to a model of its weights): the fp32 weights left in the "
     "training checkpoint's partitions, read and CRC-checked there; never written by ucp-convert -o",
     OpenPartitionsReader, nullptr},
};

const StoreEntry& EntryOf(StoreKind kind) {
  for (const auto& e : kStores)
    if (e.kind == kind) return e;
  throw Error("internal: unknown store");
}

}  // namespace

std::string_view StoreName(StoreKind kind) { return EntryOf(kind).name; }

std::vector<std::pair<std::string, std::string>> StoreDescriptions() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : kStores) out.emplace_back(e.name, e.description);
  return out;
}

StoreKind StoreFromName(const std::string& name) {
  for (const auto& e : kStores)
    if (name == e.name) return e.kind;
  throw Error("unknown store '" + name + "' (known: " + JoinNames(kStores, ", ", &StoreEntry::name) + ")");
}

StoreKind WritableStoreFromName(const std::string& name) {
  const StoreKind kind = StoreFromName(name);
  if (!EntryOf(kind).create) {
    std::string writable;
    for (const auto& e : kStores)
      if (e.create) writable += (writable.empty() ? "" : ", ") + std::string(e.name);
    throw Error("store '" + name + "' is " + EntryOf(kind).description + " (stores an output can be: " + writable + ")");
  }
  return kind;
}

StoreKind StoreOf(const nlohmann::json& manifest) {
  if (!manifest.contains("store")) return StoreKind::Pt;
  return StoreFromName(manifest.at("store").get<std::string>());
}

AtomWriter::PartDigest AtomWriter::WritePart(const std::string& param, plan::State, int64_t, int64_t, const float*) {
  throw Error("internal: this store does not write '" + param + "' in parts");
}

std::vector<FileRecord> AtomWriter::FinishParts(const std::string& param, plan::State, uint32_t, const std::vector<WrittenPart>&) {
  throw Error("internal: this store does not write '" + param + "' in parts");
}

bool WritesParts(StoreKind kind, int zero_stage) { return kind == StoreKind::Pt && zero_stage < 3; }

bool DeepSpeedResumes(const nlohmann::json& manifest) {
  return StoreOf(manifest) == StoreKind::Pt && !CarriedModelStates(manifest).empty() &&
         !manifest.at("source").value("weights_only", false);
}

bool PointsLatestUniversal(const std::string& dir, const nlohmann::json& manifest) {
  if (!DeepSpeedResumes(manifest)) return false;
  namespace fs = std::filesystem;
  fs::path path = fs::absolute(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  const fs::path root = path.parent_path();
  const std::string tag = manifest.at("source").value("tag", "");
  std::error_code ec;
  return !tag.empty() && fs::is_regular_file(root / "latest", ec) && fs::is_directory(root / tag, ec);
}

// ---------------------------------------------------------------------------------------------
// Reader

void CheckAtomsH5Whole(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir + "/" + kManifestName, ec)) return;
  const nlohmann::json m = ReadManifest(dir);
  if (WithContext(dir + "/" + kManifestName, [&] { return StoreOf(m); }) != StoreKind::Hdf5) return;
  for (const auto& f : m.at("files")) {
    const FileRecord r = FileRecord::FromJson(f);
    if (r.path != kAtomsH5) continue;
    std::string why;
    if (!Verify(dir, r, &why))
      throw Error(dir + "/" + r.path + ": " + why + ": the file is damaged or changed since ucp-convert wrote it (its "
                  "size and XXH64 are checked whole against " + kManifestName + " before HDF5 reads any of it), so none of "
                  "it is read; convert the source again (ucp-convert SOURCE -o " + dir + " --format hdf5 --force)");
    return;
  }
  throw Error(dir + "/" + kManifestName + ": does not list " + kAtomsH5 + ", the HDF5 store's file");
}

std::unique_ptr<AtomReader> AtomReader::Open(const std::string& dir) {
  nlohmann::json m = ReadAtomicManifest(dir);  // ucp's manifest, or a DeepSpeed universal folder's description
  StoreKind kind = WithContext(dir + "/" + kManifestName, [&] { return StoreOf(m); });
  return EntryOf(kind).open(dir, std::move(m));
}

AtomReader::AtomReader(StoreKind store, std::string dir, nlohmann::json manifest)
    : store_(store), dir_(std::move(dir)), manifest_(std::move(manifest)) {
  WithContext(dir_ + "/" + kManifestName, [&] {
    weights_only_ = manifest_.at("source").value("weights_only", false);
    for (const auto& p : manifest_.at("params")) {
      AtomParam a;
      a.name = p.at("name").get<std::string>();
      a.shape = p.at("shape").get<std::vector<int64_t>>();
      a.numel = p.at("numel").get<int64_t>();
      if (WithContext("parameter '" + a.name + "'", [&] { return pt::CheckedNumel(a.shape); }) != a.numel)
        throw Error("parameter '" + a.name + "': numel does not match its shape");
      a.pattern = p.at("pattern").get<std::string>();
      a.split_dim = p.at("split_dim").is_null() ? -1 : p.at("split_dim").get<int>();
      a.split_dim_known = p.at("split_dim_known").get<bool>();
      a.vocab = p.at("vocab").get<bool>();
      a.sub_param_sizes = p.at("sub_param_sizes").get<std::vector<int64_t>>();
      a.group = p.value("group", 0);
      // (a DeepSpeed ZeRO-3 universal folder keeps its groups' steps in zero/optimizer_state.pt only)
      if (store_ == StoreKind::Pt) a.has_step = p.at("files").contains("step") || p.value("step_in_optimizer_state", false);
      else if (store_ == StoreKind::Hdf5) a.has_step = p.at("hdf5").at("step").get<bool>();
      a.meta = p;
      a.meta.erase("files");
      a.meta.erase("hdf5");
      a.meta.erase("partitions");
      ParamRelDir(a.name);  // a name that could leave zero/ (or is no HDF5 link name) is refused
      if (!index_.emplace(a.name, params_.size()).second) throw Error("parameter '" + a.name + "' is listed twice");
      params_.push_back(std::move(a));
    }
    for (const auto& f : manifest_.at("files")) {
      FileRecord r = FileRecord::FromJson(f);
      records_[r.path] = r;
    }
  });
}

pt::TorchFile AtomReader::ReadCheckedFile(const std::string& rel, const std::string& what) const {
  const std::string path = dir_ + "/" + rel, about = what.empty() ? "" : what + ": ";
  auto it = records_.find(rel);
  if (it == records_.end()) throw Error(path + ": " + about + "the manifest's file list does not name it");
  if (it->second.zip_crc32) {  // a DeepSpeed universal folder's file: every zip record's CRC-32
    pt::TorchFile file = pt::ReadTorchFile(path, {.verify_pickle_crc = true, .verify_storage_crc = true});
    file.archive->file()->ReleaseResidentPages();
    if (file.archive->file()->size() != it->second.bytes)
      throw Error(path + ": " + about + "the file is damaged: " + std::to_string(file.archive->file()->size()) +
                  " bytes, it held " + std::to_string(it->second.bytes) + " when the folder was read");
    return file;
  }
  // Hashed before it is parsed: no byte of a damaged file is interpreted.
  std::shared_ptr<MappedFile> mapped = MappedFile::Open(path);
  const std::string mismatch = MismatchOf(it->second, *mapped);
  mapped->ReleaseResidentPages();  // (a record in parts was hashed from the mapping)
  if (!mismatch.empty())
    throw Error(path + ": " + about + "the file is damaged: " + mismatch + " (ucp-inspect --verify checks every file)");
  return pt::ReadTorchArchive(std::make_shared<pt::ZipArchive>(std::move(mapped)));
}

std::string AtomReader::ReadCheckedBytes(const std::string& rel, const std::string& what) const {
  const std::string path = dir_ + "/" + rel, about = what.empty() ? "" : what + ": ";
  auto it = records_.find(rel);
  if (it == records_.end()) throw Error(path + ": " + about + "the manifest's file list does not name it");
  std::shared_ptr<MappedFile> mapped = MappedFile::Open(path);
  const std::string mismatch = it->second.Mismatch(mapped->bytes());
  if (!mismatch.empty())
    throw Error(path + ": " + about + "the file is damaged: " + mismatch + " (ucp-inspect --verify checks every file)");
  const auto bytes = mapped->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

const AtomParam& AtomReader::param(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(dir_ + ": no parameter '" + name + "' in the manifest");
  return params_[it->second];
}

void AtomReader::CheckSlab(const AtomParam& p, plan::State state, std::span<const int64_t> start,
                           std::span<const int64_t> count) const {
  auto fail = [&](const std::string& why) {
    throw Error(dir_ + ": parameter '" + p.name + "' " + std::string(plan::StateName(state)) + ": slab " + why);
  };
  if (weights_only_ && state != plan::State::Fp32)
    throw Error(dir_ + ": parameter '" + p.name + "' " + std::string(plan::StateName(state)) + ": the atomic checkpoint "
                "holds weights only (its manifest's source.weights_only): no Adam moments to read");
  if (start.size() != p.shape.size() || count.size() != p.shape.size())
    fail("of rank " + std::to_string(start.size()) + "/" + std::to_string(count.size()) + " for a tensor of shape " +
         pt::ShapeString(p.shape));
  for (size_t d = 0; d < p.shape.size(); ++d)
    if (start[d] < 0 || count[d] < 0 || start[d] + count[d] > p.shape[d])
      fail(std::string("[") + std::to_string(start[d]) + ", " + std::to_string(start[d] + count[d]) + ") in dimension " +
           std::to_string(d) + " outside the shape " + pt::ShapeString(p.shape));
}

void AtomReader::ReadAll(const std::string& name, plan::State state, float* dst) {
  const AtomParam& p = param(name);
  std::vector<int64_t> start(p.shape.size(), 0);
  ReadSlab(name, state, start, p.shape, dst);
}

uint64_t AtomReader::TensorDigest(const std::string& name, plan::State state) {
  return DigestBySlabs(param(name).shape, [&](std::span<const int64_t> start, std::span<const int64_t> count, float* dst) {
    ReadSlab(name, state, start, count, dst);
  });
}

uint64_t DigestBySlabs(const std::vector<int64_t>& shape,
                       const std::function<void(std::span<const int64_t>, std::span<const int64_t>, float*)>& read) {
  XxHash64 h;
  if (shape.empty()) {
    float v = 0;
    read({}, {}, &v);
    h.Update(&v, sizeof v);
    return h.Digest();
  }
  const int64_t numel = pt::Numel(shape);
  const int64_t row = shape[0] > 0 ? numel / shape[0] : 0;
  const int64_t rows = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(1, row));
  std::vector<float> buf(static_cast<size_t>(std::min(rows, shape[0]) * row));
  std::vector<int64_t> start(shape.size(), 0), count = shape;
  for (int64_t r = 0; r < shape[0]; r += rows) {
    start[0] = r;
    count[0] = std::min(rows, shape[0] - r);
    read(start, count, buf.data());
    h.Update(buf.data(), static_cast<size_t>(count[0] * row) * sizeof(float));
  }
  return h.Digest();
}

// ---------------------------------------------------------------------------------------------
// Writer

std::unique_ptr<AtomWriter> AtomWriter::Create(StoreKind store, const std::string& dir, std::vector<AtomSpec> specs,
                                               shuffle::Comm& comm) {
  const StoreEntry& e = EntryOf(store);
  if (!e.create) throw Error("internal: the " + std::string(e.name) + " store is not written through an AtomWriter");
  return e.create(dir, std::move(specs), comm);
}

AtomWriter::AtomWriter(std::string dir, std::vector<AtomSpec> specs) : dir_(std::move(dir)), specs_(std::move(specs)) {
  for (size_t k = 0; k < specs_.size(); ++k) {
    ParamRelDir(specs_[k].name);
    if (!index_.emplace(specs_[k].name, k).second) throw Error("parameter '" + specs_[k].name + "' given twice");
  }
}

const AtomSpec& AtomWriter::spec(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(dir_ + ": parameter '" + name + "' was not declared to the writer");
  return specs_[it->second];
}

// ---------------------------------------------------------------------------------------------

std::vector<std::string> AtomicFolderMarkers() { return {kManifestName}; }
std::vector<std::string> AtomicFolderContents() { return {kJournalDir, "zero", kAtomsH5}; }

std::vector<int64_t> ChunkShape(const std::vector<int64_t>& shape, int split_dim,
                                const std::vector<int64_t>& sub_param_sizes) {
  if (shape.empty() || pt::Numel(shape) == 0) return {};
  constexpr int64_t kTarget = (int64_t{1} << 20) / 4;  // elements in about 1 MiB
  std::vector<int64_t> chunk = shape;
  chunk[0] = 1;
  if (split_dim > 0 && static_cast<size_t>(split_dim) < shape.size()) {
    int64_t n = shape[static_cast<size_t>(split_dim)];
    for (int64_t parts : {8, 4, 2})
      if (n % parts == 0) {
        chunk[static_cast<size_t>(split_dim)] = n / parts;
        break;
      }
  }
  const int64_t target = std::clamp<int64_t>(kTarget / std::max<int64_t>(1, pt::Numel(chunk)), 1, shape[0]);
  // Rows per chunk: a divisor of the unit every slice boundary along dimension 0 is a multiple of
  // (the whole dimension; split along it, its TP eighths, quarters or halves, per sub-parameter), so
  // that no chunk straddles two readers and no edge chunk is stored half empty.
  int64_t unit = shape[0];
  if (split_dim == 0) {
    for (int64_t s : sub_param_sizes) unit = std::gcd(unit, s);
    for (int64_t parts : {8, 4, 2})
      if (unit % parts == 0) {
        unit /= parts;
        break;
      }
  }
  int64_t best = 1;
  for (int64_t d = 1; d * d <= unit; ++d)
    if (unit % d == 0) {
      if (d <= target) best = std::max(best, d);
      if (unit / d <= target) best = std::max(best, unit / d);
    }
  // A unit with no divisor near the target (a prime vocabulary size): plain ~1 MiB chunks.
  chunk[0] = best * 8 >= target ? best : target;
  return chunk;
}

std::optional<int64_t> ContiguousSlabStart(std::span<const int64_t> shape, std::span<const int64_t> start,
                                           std::span<const int64_t> count) {
  const size_t n = shape.size();
  size_t inner = n;  // dimensions [inner, n) are whole
  while (inner > 0 && count[inner - 1] == shape[inner - 1]) --inner;
  for (size_t d = 0; d + 1 < inner; ++d)
    if (count[d] != 1) return std::nullopt;  // outside the partial dimension, one index only
  int64_t offset = 0;
  for (size_t d = 0; d < n; ++d) offset = offset * shape[d] + start[d];
  return offset;
}

void CopySlab(const uint8_t* src, std::span<const int64_t> shape, std::span<const int64_t> start,
              std::span<const int64_t> count, float* dst) {
  const size_t n = shape.size();
  if (n == 0) {
    std::memcpy(dst, src, sizeof(float));
    return;
  }
  for (int64_t c : count)
    if (c == 0) return;
  std::vector<int64_t> stride(n, 1);
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  // The contiguous run: the innermost dimension's count, times every dimension outside it whose
  // inner dimensions are taken whole (a block of full rows is one copy). The dimensions outside the
  // run are iterated like an odometer.
  size_t inner = n - 1;
  int64_t run = count[n - 1];
  while (inner > 0 && count[inner] == shape[inner]) run *= count[--inner];
  std::vector<int64_t> idx(inner, 0);
  while (true) {
    int64_t off = start[inner] * stride[inner];
    for (size_t d = 0; d < inner; ++d) off += (start[d] + idx[d]) * stride[d];
    std::memcpy(dst, src + off * sizeof(float), static_cast<size_t>(run) * sizeof(float));
    dst += run;
    size_t d = inner;
    while (d > 0) {
      if (++idx[d - 1] < count[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

}  // namespace ucp::store
