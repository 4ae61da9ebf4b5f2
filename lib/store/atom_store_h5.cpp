// The HDF5 store: one atoms.h5 (schemas/atoms-h5.schema.json), every HDF5 call through lib/h5.
//
// Writing, and why in this order (the atomicity protocol of core/atomic_file.h, for one file that
// many ranks write):
//   1. every rank creates <dir>/atoms.h5.tmp-<pid>-<n> (rank 0's) together (MPI-IO under MPI), then every
//      group and dataset, collectively, from the same list: parallel HDF5 wants metadata changes
//      collective, and space is allocated at creation so raw writes change no metadata;
//   2. each rank writes the datasets it holds, each with one independent H5Dwrite;
//   3. the file is closed (collective); rank 0 reopens it alone and adds the attributes (metadata,
//      universal keys, steps, the XXH64 of every dataset, gathered from the ranks that wrote them),
//      closes it, fsyncs it, renames it to atoms.h5 and fsyncs the folder;
//   4. the caller writes the manifest last. A killed run leaves only atoms.h5.tmp-*.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/fault_point.h"
#include "core/file_descriptor.h"
#include "core/xxhash64.h"
#include "h5/h5.h"
#include "shuffle/agree.h"
#include "store/atom_store.h"

namespace ucp::store {
namespace fs = std::filesystem;
using pt::Value;

namespace {

constexpr const char* kLayoutName = "ucp-atoms-h5";
constexpr const char* kUniversal = "universal.";

void FsyncPath(const std::string& path, bool directory) {
  Fd fd = Fd::Open(path, directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (!fd.open()) throw Error(path + ": cannot open to fsync: " + std::strerror(errno));
  int rc = ::fsync(fd.get());
  int e = errno;
  fd.Reset();
  if (rc != 0) throw Error(path + ": fsync failed: " + std::strerror(e));
}

// The manifest's metadata as attributes: bool as int64 0/1, null left out, an object's fields as
// "<key>.<field>", arrays of integers or strings as 1-D attributes.
void SetMetaAttributes(const h5::Object& o, const nlohmann::json& meta, const std::string& prefix = "") {
  for (const auto& [key, v] : meta.items()) {
    if (prefix.empty() && key == "name") continue;
    const std::string name = prefix + key;
    if (v.is_null()) continue;
    if (v.is_boolean()) o.SetAttribute(name, int64_t{v.get<bool>() ? 1 : 0});
    else if (v.is_number_integer()) o.SetAttribute(name, v.get<int64_t>());
    else if (v.is_number_float()) {
      double d = v.get<double>();
      o.SetScalarAttribute(name, h5::Object::Numeric::F64, &d);
    } else if (v.is_string()) o.SetAttribute(name, v.get<std::string>());
    else if (v.is_object()) SetMetaAttributes(o, v, name + ".");
    else if (v.is_array() && !v.empty() && v[0].is_string()) o.SetAttribute(name, v.get<std::vector<std::string>>());
    else if (v.is_array()) o.SetAttribute(name, std::span<const int64_t>(v.get<std::vector<int64_t>>()));
  }
}

void SetUniversalAttributes(const h5::Object& o, const UniversalKeys& k) {
  const std::string u = kUniversal;
  if (k.cat_dim) o.SetAttribute(u + "cat_dim", *k.cat_dim);
  if (k.param_n_sub_params) o.SetAttribute(u + "param_n_sub_params", *k.param_n_sub_params);
  if (k.sub_param_shape) {
    o.SetAttribute(u + "sub_param_shape.patterns", k.sub_param_shape->patterns);
    o.SetAttribute(u + "sub_param_shape.sizes", std::span<const int64_t>(k.sub_param_shape->sizes));
    o.SetAttribute(u + "sub_param_shape.partition_dim", k.sub_param_shape->partition_dim);
  }
  o.SetAttribute(u + "vocab_tensor", int64_t{k.vocab_tensor ? 1 : 0});
  if (k.bare_numel) o.SetAttribute(u + "zero3_numel", *k.bare_numel);
  if (k.ep_num_experts) o.SetAttribute(u + "ep_num_experts", *k.ep_num_experts);
}

UniversalKeys UniversalAttributes(const h5::Object& o) {
  const std::string u = kUniversal;
  UniversalKeys k;
  if (o.HasAttribute(u + "cat_dim")) k.cat_dim = o.IntAttribute(u + "cat_dim");
  if (o.HasAttribute(u + "param_n_sub_params")) k.param_n_sub_params = o.IntAttribute(u + "param_n_sub_params");
  if (o.HasAttribute(u + "sub_param_shape.patterns")) {
    UniversalKeys::SubParamShape sp;
    sp.patterns = o.StringsAttribute(u + "sub_param_shape.patterns");
    sp.sizes = o.IntsAttribute(u + "sub_param_shape.sizes");
    sp.partition_dim = o.IntAttribute(u + "sub_param_shape.partition_dim");
    k.sub_param_shape = sp;
  }
  k.vocab_tensor = o.IntAttribute(u + "vocab_tensor") != 0;
  if (o.HasAttribute(u + "zero3_numel")) k.bare_numel = o.IntAttribute(u + "zero3_numel");
  if (o.HasAttribute(u + "ep_num_experts")) k.ep_num_experts = o.IntAttribute(u + "ep_num_experts");
  return k;
}

// The step as an attribute "step" of its own type and "step_kind": "tensor" (0-dim), "int", "float".
void CheckStep(const std::string& name, const Value& step) {
  bool ok = step.kind == Value::Kind::Int || step.kind == Value::Kind::Float;
  if (step.kind == Value::Kind::Tensor) {
    const auto& t = step.AsTensor();
    ok = t.shape.empty() && (t.dtype == pt::DType::F32 || t.dtype == pt::DType::F64 || t.dtype == pt::DType::I64);
  }
  if (!ok)
    throw Error("parameter '" + name + "': its step is " + step.TypeName() +
                "; the HDF5 store keeps a 0-dim float32, float64 or int64 tensor, or a Python int or float");
}

void SetStepAttributes(const h5::Object& o, const Value& step) {
  using N = h5::Object::Numeric;
  if (step.kind == Value::Kind::Int) {
    o.SetScalarAttribute("step", N::I64, &step.i);
    o.SetAttribute("step_kind", std::string("int"));
  } else if (step.kind == Value::Kind::Float) {
    o.SetScalarAttribute("step", N::F64, &step.f);
    o.SetAttribute("step_kind", std::string("float"));
  } else {
    const auto& t = step.AsTensor();
    N n = t.dtype == pt::DType::F32 ? N::F32 : t.dtype == pt::DType::F64 ? N::F64 : N::I64;
    o.SetScalarAttribute("step", n, t.data());
    o.SetAttribute("step_kind", std::string("tensor"));
  }
}

pt::ValuePtr StepAttributes(const h5::Object& o) {
  using N = h5::Object::Numeric;
  auto bytes = std::make_shared<uint64_t>(0);
  N n = o.ScalarAttribute("step", bytes.get());
  std::string kind = o.StringAttribute("step_kind");
  // The attribute's 8 bytes as the type they were written as (bit_cast: not read through another type's pointer).
  if (kind == "int" && n == N::I64) return Value::Int(std::bit_cast<int64_t>(*bytes));
  if (kind == "float" && n == N::F64) return Value::Float(std::bit_cast<double>(*bytes));
  if (kind == "tensor") {
    pt::DType d = n == N::F32 ? pt::DType::F32 : n == N::F64 ? pt::DType::F64 : pt::DType::I64;
    const void* p = bytes.get();
    return pt::OwnedTensor(std::shared_ptr<const void>(bytes, p), p, d, {});
  }
  throw Error(o.file() + ": " + o.path() + ": step_kind '" + kind + "' does not fit the step attribute's type");
}

h5::File OpenAtoms(const std::string& path) {
  if (!fs::exists(path)) throw Error(path + ": missing (the manifest names the hdf5 store)");
  return h5::File::Open(path, false);
}

class H5Reader final : public AtomReader {
 public:
  H5Reader(const std::string& dir, nlohmann::json manifest)
      : AtomReader(StoreKind::Hdf5, dir, std::move(manifest)), file_(OpenAtoms(dir + "/" + kAtomsH5)) {
    std::string path = dir + "/" + kAtomsH5;
    if (!file_.HasAttribute("ucp_layout") || file_.StringAttribute("ucp_layout") != kLayoutName)
      throw Error(path + ": not a ucp atoms file (no root attribute ucp_layout = '" + kLayoutName + "')");
    int64_t v = file_.IntAttribute("ucp_layout_version");
    if (v > kAtomsH5Version)
      throw Error(path + ": layout version " + std::to_string(v) + " is newer than this ucp reads (" +
                  std::to_string(kAtomsH5Version) + ")");
  }

  void ReadSlab(const std::string& name, plan::State state, std::span<const int64_t> start,
                std::span<const int64_t> count, float* dst) override {
    const AtomParam& p = param(name);
    CheckSlab(p, state, start, count);
    auto ds = Dataset(p, state);
    ds->dataset.ReadSlab(start, count, dst);
    const int64_t n = pt::Numel({count.begin(), count.end()});
    bytes_read_ += 4 * static_cast<uint64_t>(n);
    // Every chunk the slab touches is read whole.
    int64_t touched = n == 0 ? 0 : 1;
    for (size_t d = 0; d < ds->chunk.size() && n > 0; ++d)
      touched *= (start[d] + count[d] + ds->chunk[d] - 1) / ds->chunk[d] - start[d] / ds->chunk[d];
    storage_bytes_read_ += 4 * static_cast<uint64_t>(ds->chunk.empty() ? n : touched * pt::Numel(ds->chunk));
  }

  pt::ValuePtr ReadStep(const std::string& name) override {
    const AtomParam& p = param(name);
    if (!p.has_step) return nullptr;
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return StepAttributes(file_.OpenGroup(name));
  }

  UniversalKeys ReadUniversalKeys(const std::string& name) override {
    param(name);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return UniversalAttributes(file_.OpenGroup(name));
  }

  std::vector<int64_t> ReadBlock(const std::string& name, plan::State state) override {
    if (weights_only() && state != plan::State::Fp32) return {};  // no such dataset: ReadSlab says why
    return Dataset(param(name), state)->chunk;
  }

  void Forget(const std::string& name) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    for (int s = 0; s < plan::kStates; ++s) open_.erase({name, s});
  }

  // The XXH64 the file records for a dataset (attribute "xxh64").
  std::string RecordedDigest(const std::string& name, plan::State state) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return Dataset(param(name), state)->dataset.StringAttribute("xxh64");
  }

 private:
  struct Open {
    h5::Dataset dataset;
    std::vector<int64_t> chunk;  // empty: contiguous
  };

  // The dataset, opened once and checked: float32 of the manifest's shape.
  std::shared_ptr<Open> Dataset(const AtomParam& p, plan::State state) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto& d = open_[{p.name, static_cast<int>(state)}];
    if (d) return d;
    const std::string recorded = RecordedInManifest(p.name, state);  // refuses a state a weights-only one lacks
    auto ds = std::make_shared<Open>();
    ds->dataset = file_.OpenGroup(p.name).OpenDataset(std::string(plan::StateName(state)));
    const std::string where = ds->dataset.file() + ": " + ds->dataset.path();
    if (!ds->dataset.IsFloat32()) throw Error(where + ": not a little-endian float32 dataset");
    if (ds->dataset.Shape() != p.shape)
      throw Error(where + ": shape " + pt::ShapeString(ds->dataset.Shape()) + ", the manifest says " +
                  pt::ShapeString(p.shape));
    ds->chunk = ds->dataset.ChunkShape();
    // The dataset against the manifest's XXH64 of it, read whole the first time it is opened, before
    // any of its bytes is used: a damaged atom is refused naming the parameter and state, never resharded.
    const uint64_t digest = DigestBySlabs(p.shape, [&](std::span<const int64_t> a, std::span<const int64_t> n, float* to) {
      ds->dataset.ReadSlab(a, n, to);
    });
    if (HexDigest(digest) != recorded)
      throw Error(where + ": parameter '" + p.name + "' " + std::string(plan::StateName(state)) +
                  ": the dataset is damaged: XXH64 " + HexDigest(digest) + ", the manifest says " + recorded +
                  " (ucp-inspect --verify checks every dataset)");
    d = std::move(ds);
    return d;
  }

  // The XXH64 (hex) the manifest records for a parameter's dataset.
  std::string RecordedInManifest(const std::string& name, plan::State state) {
    if (recorded_.empty())
      for (const auto& p : manifest().at("params"))
        WithContext(dir() + "/" + kManifestName + ": parameter '" + p.at("name").get<std::string>() + "'", [&] {
          for (int s = 0; s < states(); ++s)
            recorded_[{p.at("name").get<std::string>(), s}] =
                p.at("hdf5").at("xxh64").at(std::string(plan::StateName(static_cast<plan::State>(s)))).get<std::string>();
        });
    auto it = recorded_.find({name, static_cast<int>(state)});
    if (it == recorded_.end())
      throw Error(dir() + ": parameter '" + name + "' has no " + std::string(plan::StateName(state)) + ": the checkpoint holds weights only");
    return it->second;
  }
  std::map<std::pair<std::string, int>, std::string> recorded_;  // filled on first use, under mu_

  std::recursive_mutex mu_;
  h5::File file_;
  std::map<std::pair<std::string, int>, std::shared_ptr<Open>> open_;
};

class H5Writer final : public AtomWriter {
 public:
  H5Writer(const std::string& dir, std::vector<AtomSpec> specs, shuffle::Comm& comm)
      : AtomWriter(dir, std::move(specs)), comm_(comm) {
    for (const auto& s : specs_)
      if (s.step) CheckStep(s.name, *s.step);
    final_ = dir_ + "/" + kAtomsH5;
    int64_t name[2] = {0, 0};  // rank 0's pid and serial: one temporary name on every rank
    if (comm.rank() == 0) name[0] = ::getpid(), name[1] = static_cast<int64_t>(NextTemporarySerial());
    comm.AllreduceMax(name);
    temp_ = TemporaryName(final_, static_cast<long>(name[0]), static_cast<uint64_t>(name[1]));
    try {
      file_ = h5::File::Create(temp_, comm.size() > 1 ? comm.mpi_comm() : nullptr);
      for (const auto& s : specs_) {
        h5::Group g = file_.CreateGroup(s.name);
        auto chunk = ChunkShape(s.shape, s.split_dim, s.meta.value("sub_param_sizes", std::vector<int64_t>{}));
        for (int k = 0; k < StatesOf(s); ++k)
          g.CreateFloatDataset(std::string(plan::StateName(static_cast<plan::State>(k))), s.shape, chunk);
      }
      // Every block the file will use, taken now (rank 0), while a full disk is one clear error
      // every rank learns of: later, a write that fails on one rank inside a collective close
      // would leave the others waiting.
      std::string error = comm.rank() == 0 ? shuffle::Capture([&] { Reserve(temp_, file_.Size()); }) : "";
      int64_t failed = error.empty() ? 0 : 1;
      comm.AllreduceMax({&failed, 1});
      if (failed) throw Error(comm.rank() == 0 ? error : temp_ + ": rank 0 could not reserve the file's space");
    } catch (...) {
      Abandon();
      throw;
    }
  }

  ~H5Writer() override {
    if (!committed_) Abandon();
  }

  std::vector<FileRecord> Write(const std::string& name, plan::State state, const float* data) override {
    const AtomSpec& s = spec(name);
    uint64_t digest = XxHash64::Of(data, 4 * static_cast<size_t>(pt::Numel(s.shape)));
    std::lock_guard<std::mutex> lock(mu_);
    file_.OpenGroup(name).OpenDataset(std::string(plan::StateName(state))).WriteAll(data);
    digests_[name][std::string(plan::StateName(state))] = HexDigest(digest);
    FaultPoint("h5-dataset", temp_ + ":/" + name + "/" + std::string(plan::StateName(state)));
    return {};
  }

  bool concurrent() const override { return false; }

  StoreCommit Commit() override {
    // Collective steps first, each rank's failure kept for after them: no rank may skip one.
    std::string error = shuffle::Capture([&] { file_.CloseFile(); });  // never closed again, even if it failed
    auto gathered = comm_.GatherToRoot(nlohmann::json(digests_).dump());
    if (!error.empty()) throw Error(error);
    StoreCommit c;
    if (comm_.rank() != 0) {
      committed_ = true;
      return c;
    }
    nlohmann::json digests = nlohmann::json::object();
    for (const auto& g : gathered) {
      const nlohmann::json one = nlohmann::json::parse(g);  // outlives the loop over its items
      for (const auto& [name, states] : one.items())
        for (const auto& [state, hex] : states.items()) digests[name][state] = hex;
    }
    c.storage = nlohmann::json::object();
    {
      h5::File f = h5::File::Open(temp_, true);
      f.SetAttribute("ucp_layout", std::string(kLayoutName));
      f.SetAttribute("ucp_layout_version", int64_t{kAtomsH5Version});
      f.SetAttribute("ucp_version", std::string(UCP_VERSION));
      for (const auto& s : specs_) {
        h5::Group g = f.OpenGroup(s.name);
        SetMetaAttributes(g, s.meta);
        SetUniversalAttributes(g, s.keys);
        if (s.step) SetStepAttributes(g, *s.step);
        nlohmann::json xx;
        for (int k = 0; k < StatesOf(s); ++k) {
          std::string state(plan::StateName(static_cast<plan::State>(k)));
          if (!digests.contains(s.name) || !digests[s.name].contains(state))
            throw Error(temp_ + ": internal: no rank wrote /" + s.name + "/" + state);
          std::string hex = digests[s.name][state];
          g.OpenDataset(state).SetAttribute("xxh64", hex);
          xx[state] = hex;
        }
        c.storage[s.name] = {{"hdf5", {{"group", "/" + s.name}, {"step", s.step != nullptr}, {"xxh64", xx}}}};
      }
      f.CloseFile();
    }
    FsyncPath(temp_, false);
    FaultPoint("h5-closed", temp_);
    if (::rename(temp_.c_str(), final_.c_str()) != 0)
      throw Error(final_ + ": cannot rename " + temp_ + " to it: " + std::strerror(errno));
    committed_ = true;
    FsyncPath(dir_, true);
    uint64_t size = 0;
    uint64_t digest = XxHash64File(final_, &size);
    c.files.push_back({kAtomsH5, size, digest});
    return c;
  }

 private:
  // fallocate(2) of [0, bytes): blocks taken now, or ENOSPC now. A file system that cannot
  // (EOPNOTSUPP) writes without the reservation.
  static void Reserve(const std::string& path, int64_t bytes) {
    Fd fd = Fd::Open(path, O_WRONLY);
    if (!fd.open()) throw Error(path + ": cannot open to reserve its space: " + std::strerror(errno));
    const int rc = bytes > 0 ? ::fallocate(fd.get(), 0, 0, bytes) : 0, err = errno;
    fd.Reset();
    if (rc != 0 && err != EOPNOTSUPP && err != ENOSYS)
      throw Error(path + ": cannot reserve " + std::to_string(bytes) + " bytes for the HDF5 store: " + std::strerror(err));
  }

  // After a failure: the file is let go (closed when written by this process alone, else
  // abandoned, see h5::File::Abandon) and the temporary removed.
  void Abandon() {
    if (comm_.size() > 1) {
      file_.Abandon();
    } else {
      try {
        file_ = h5::File();
      } catch (...) {
      }
    }
    if (comm_.rank() == 0) ::unlink(temp_.c_str());
  }

  shuffle::Comm& comm_;
  std::string temp_, final_;
  h5::File file_;
  std::mutex mu_;
  std::map<std::string, std::map<std::string, std::string>> digests_;  // param -> state -> hex
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<AtomReader> OpenH5Reader(const std::string& dir, nlohmann::json manifest) {
  return std::make_unique<H5Reader>(dir, std::move(manifest));
}

std::unique_ptr<AtomWriter> CreateH5Writer(const std::string& dir, std::vector<AtomSpec> specs, shuffle::Comm& comm) {
  return std::make_unique<H5Writer>(dir, std::move(specs), comm);
}

std::string RecordedDatasetDigest(AtomReader& reader, const std::string& param, plan::State state) {
  auto* h5 = dynamic_cast<H5Reader*>(&reader);
  if (!h5) throw Error("internal: RecordedDatasetDigest of a store other than hdf5");
  return h5->RecordedDigest(param, state);
}

}  // namespace ucp::store
