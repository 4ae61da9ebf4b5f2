// The .pt store: DeepSpeed's universal layout, one torch.save file per parameter and state. Reads
// copy slabs out of the memory-mapped files; writes are StateFileValue + WriteTorchFile, each file
// renamed into place whole, all of them made durable by one file-system sync at Commit.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "core/atomic_file.h"
#include "core/commit.h"
#include "core/error.h"
#include "core/fault_point.h"
#include "core/file_descriptor.h"
#include "core/mapped_file.h"
#include "core/names.h"
#include "core/xxhash64.h"
#include "pt/zip_archive.h"
#include "pt/torch_file.h"
#include "store/atom_store.h"

namespace ucp::store {
namespace fs = std::filesystem;

namespace {

class PtReader final : public AtomReader {
 public:
  PtReader(const std::string& dir, nlohmann::json manifest) : AtomReader(StoreKind::Pt, dir, std::move(manifest)) {
    WithContext(dir + "/" + kManifestName, [&] {
      for (const auto& p : this->manifest().at("params")) {
        auto& f = files_[p.at("name").get<std::string>()];
        for (int s = 0; s < states(); ++s)
          f[s] = p.at("files").at(std::string(plan::StateName(static_cast<plan::State>(s)))).get<std::string>();
        if (p.at("files").contains("step")) f[plan::kStates] = p.at("files").at("step").get<std::string>();
        for (const auto& path : f)
          if (!path.empty()) RequirePlainRelativePath(path, "file of parameter '" + p.at("name").get<std::string>() + "'");
      }
    });
  }

  void ReadSlab(const std::string& name, plan::State state, std::span<const int64_t> start,
                std::span<const int64_t> count, float* dst) override {
    const AtomParam& p = param(name);
    CheckSlab(p, state, start, count);
    std::shared_ptr<const pt::TorchFile> file = Tensor(p, state);
    const pt::TensorView& t = ParamOf(*file->root);
    const MappedFile& mapped = *file->archive->file();
    const uint64_t bytes = 4 * static_cast<uint64_t>(pt::Numel({count.begin(), count.end()}));
    const bool in_file = t.data() >= mapped.bytes().data() && t.data() + t.nbytes() <= mapped.bytes().data() + mapped.size();
    if (auto first = ContiguousSlabStart(p.shape, start, count); first && in_file) {
      // One run of the file: read by offset, without faulting in the mapping.
      mapped.ReadAt(static_cast<uint64_t>(t.data() - mapped.bytes().data()) + 4 * static_cast<uint64_t>(*first), bytes, dst);
    } else {
      CopySlab(t.data(), p.shape, start, count, dst);
      mapped.ReleaseResidentPages();  // copied: the mapping's pages need not count as ours
    }
    bytes_read_ += bytes;
    storage_bytes_read_ += bytes;
  }

  pt::ValuePtr ReadStep(const std::string& name) override {
    const AtomParam& p = param(name);
    if (!p.has_step) return nullptr;
    const std::string& rel = files_.at(name)[plan::kStates];
    if (rel.empty()) {  // DeepSpeed's ZeRO-3 universal form: the group's step in zero/optimizer_state.pt
      const pt::ValuePtr state = OptimizerState();
      return WithContext(dir() + "/zero/optimizer_state.pt: optimizer_state_dict.state[" + std::to_string(p.group) + "]",
                         [&] {
                           auto group = state->At("optimizer_state_dict").At("state").AsDict().Get(int64_t{p.group});
                           auto step = group ? group->Get("step") : nullptr;
                           if (!step) throw Error("no step");
                           return step;
                         });
    }
    return ReadCheckedFile(rel, "parameter '" + name + "' step").root;
  }

  UniversalKeys ReadUniversalKeys(const std::string& name) override {
    const AtomParam& p = param(name);
    std::optional<UniversalKeys> keys;
    for (int s = 0; s < states(); ++s) {
      auto state = static_cast<plan::State>(s);
      std::string path = dir() + "/" + files_.at(name)[s];
      auto file = Tensor(p, state);
      UniversalKeys k = WithContext(path, [&] { return UniversalKeysOfStateFile(*file->root, p.shape); });
      if (keys && !(*keys == k))
        throw Error(path + ": its DeepSpeed keys differ from those of " + files_.at(name)[0]);
      keys = k;
    }
    return *keys;
  }

  std::vector<int64_t> ReadBlock(const std::string&, plan::State) override { return {}; }

  void Forget(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (int s = 0; s < plan::kStates; ++s) open_.erase({name, s});
  }

 private:
  // The state file, opened once and checked: a dict whose 'param' is a contiguous float32 tensor
  // of the manifest's shape.
  std::shared_ptr<const pt::TorchFile> Tensor(const AtomParam& p, plan::State state) {
    std::pair<std::string, int> key{p.name, static_cast<int>(state)};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = open_.find(key);
      if (it != open_.end()) return it->second;
    }
    const std::string rel = files_.at(p.name)[static_cast<int>(state)];
    if (rel.empty())
      throw Error(dir() + ": parameter '" + p.name + "' has no " + std::string(plan::StateName(state)) +
                  ": the checkpoint holds weights only");
    const std::string path = dir() + "/" + rel;
    auto file = std::make_shared<pt::TorchFile>(
        ReadCheckedFile(rel, "parameter '" + p.name + "' " + std::string(plan::StateName(state))));
    WithContext(path, [&] {
      const bool bare = file->root->kind == pt::Value::Kind::Tensor;  // DeepSpeed's ZeRO-3 form
      auto v = bare ? file->root : file->root->Get("param");
      if (!v || v->kind != pt::Value::Kind::Tensor) throw Error("no 'param' tensor");
      const pt::TensorView& t = v->AsTensor();
      if (t.dtype != pt::DType::F32) throw Error("'param' is " + std::string(pt::DTypeName(t.dtype)) + ", not float32");
      if (!t.contiguous()) throw Error("'param' is not contiguous");
      if (bare ? (t.shape.size() != 1 || static_cast<int64_t>(t.numel()) < pt::Numel(p.shape)) : t.shape != p.shape)
        throw Error("'param' has shape " + pt::ShapeString(t.shape) + ", the manifest says " + pt::ShapeString(p.shape) +
                    (bare ? " (a 1-D tensor of at least its elements in the ZeRO-3 form)" : ""));
    });
    std::lock_guard<std::mutex> lock(mu_);
    return open_.emplace(key, std::move(file)).first->second;
  }

  // zero/optimizer_state.pt, read and checked once for every parameter whose step it holds.
  pt::ValuePtr OptimizerState() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!optimizer_state_) optimizer_state_ = ReadCheckedFile("zero/optimizer_state.pt", "the groups' steps").root;
    return optimizer_state_;
  }

  // The parameter's elements: 'param' of the dict, or the bare ZeRO-3 tensor (its prefix).
  static const pt::TensorView& ParamOf(const pt::Value& root) {
    return root.kind == pt::Value::Kind::Tensor ? root.AsTensor() : root.At("param").AsTensor();
  }

  std::map<std::string, std::array<std::string, plan::kStates + 1>> files_;  // states, then step
  std::mutex mu_;
  std::map<std::pair<std::string, int>, std::shared_ptr<const pt::TorchFile>> open_;
  pt::ValuePtr optimizer_state_;  // DeepSpeed's ZeRO-3 universal form: every group's step (OptimizerState)
};

class PtWriter final : public AtomWriter {
 public:
  PtWriter(const std::string& dir, std::vector<AtomSpec> specs) : AtomWriter(dir, std::move(specs)) {}
  // A run that fails leaves no part-written file behind (a finished one was renamed away already;
  // a killed run's are removed by --resume or --force).
  ~PtWriter() override {
    for (const auto& path : split_temps_) ::unlink(path.c_str());
  }

  std::vector<FileRecord> Write(const std::string& name, plan::State state, const float* data) override {
    const AtomSpec& s = spec(name);
    fs::create_directories(dir_ + "/" + ParamRelDir(name));
    // The tensor views the caller's memory for the duration of the write: no owner, no copy.
    auto tensor = pt::OwnedTensor(std::shared_ptr<const void>(), data, pt::DType::F32, s.shape);
    std::string rel = StateRelPath(name, state);
    auto d = pt::WriteTorchFile(dir_ + "/" + rel, *StateFileValue(s.keys, s.shape, tensor), Durability::Batch);
    return WithStep(s, state, {rel, d.size, d.xxh64});
  }

  bool concurrent() const override { return true; }
  bool splits() const override { return true; }

  PartDigest WritePart(const std::string& name, plan::State state, int64_t begin, int64_t n, const float* data) override {
    const AtomSpec& s = spec(name);
    fs::create_directories(dir_ + "/" + ParamRelDir(name));
    const std::string path = SharedTemporaryName(dir_ + "/" + StateRelPath(name, state));
    const uint64_t at = Frame(s, 0).head.size() + 4 * static_cast<uint64_t>(begin);
    const auto* bytes = reinterpret_cast<const uint8_t*>(data);
    const uint64_t size = 4 * static_cast<uint64_t>(n);
    {
      std::lock_guard<std::mutex> lock(split_mu_);
      split_temps_.insert(path);
    }
    PositionedFile fd(path, O_WRONLY | O_CREAT);
    fd.WriteAt(bytes, size, at);
    FaultPoint("part-written", path);
    // Its bytes start for the disk now, as a whole file's do when it is renamed into place: the
    // file is finished only after the rounds, and left till then they would all wait for the sync.
    if (const int dup = ::fcntl(fd.fd.get(), F_DUPFD_CLOEXEC, 0); dup >= 0) StartWriteback(dup, at, size);
    fd.Close();
    return {pt::Crc32(0, {bytes, static_cast<size_t>(size)}), XxHash64::Of(bytes, static_cast<size_t>(size))};
  }

  std::vector<FileRecord> FinishParts(const std::string& name, plan::State state, uint32_t crc,
                                      const std::vector<WrittenPart>& parts) override {
    const AtomSpec& s = spec(name);
    const std::string rel = StateRelPath(name, state), path = dir_ + "/" + rel;
    const pt::TorchFileFrame f = Frame(s, crc);
    const std::string temp = SharedTemporaryName(path);
    PositionedFile fd(temp, O_WRONLY);
    fd.WriteAt(reinterpret_cast<const uint8_t*>(f.head.data()), f.head.size(), 0);
    fd.WriteAt(reinterpret_cast<const uint8_t*>(f.tail.data()), f.tail.size(), f.head.size() + f.data_size);
    fd.Close();
    // Recorded by parts: the head, each written part, the tail (no rank reads the file back).
    FileRecord r{rel, f.head.size() + f.data_size + f.tail.size(), 0};
    r.parts.push_back({0, f.head.size(), XxHash64::Of(f.head.data(), f.head.size())});
    for (const auto& p : parts) {
      if (f.head.size() + 4 * static_cast<uint64_t>(p.begin) != r.parts.back().offset + r.parts.back().bytes)
        throw Error("internal: the parts of " + path + " do not follow one another");
      r.parts.push_back({f.head.size() + 4 * static_cast<uint64_t>(p.begin), 4 * static_cast<uint64_t>(p.n), p.xxh64});
    }
    if (r.parts.back().offset + r.parts.back().bytes != f.head.size() + f.data_size)
      throw Error("internal: the parts of " + path + " do not cover its tensor");
    r.parts.push_back({f.head.size() + f.data_size, f.tail.size(), XxHash64::Of(f.tail.data(), f.tail.size())});
    std::error_code ec;
    if (fs::file_size(temp, ec) != r.bytes || ec)
      throw Error(temp + ": not " + std::to_string(r.bytes) + " bytes after its parts were written");
    if (::rename(temp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot rename " + temp + " into place: " + std::strerror(errno));
    FaultPoint("file-renamed", path);
    return WithStep(s, state, std::move(r));
  }

  // The record of a state file, and for fp32 the step.pt written beside it.
  std::vector<FileRecord> WithStep(const AtomSpec& s, plan::State state, FileRecord written) {
    std::vector<FileRecord> out = {std::move(written)};
    if (state == plan::State::Fp32 && s.step) {
      std::string srel = StepRelPath(s.name);
      auto sd = pt::WriteTorchFile(dir_ + "/" + srel, *s.step, Durability::Batch);
      out.push_back({srel, sd.size, sd.xxh64});
    }
    return out;
  }

  // The state file's bytes around its tensor (the tensor's values play no part but in `crc`).
  static pt::TorchFileFrame Frame(const AtomSpec& s, uint32_t crc) {
    auto tensor = pt::OwnedTensor(std::shared_ptr<const void>(), nullptr, pt::DType::F32, s.shape);
    return pt::FrameTorchFile(*StateFileValue(s.keys, s.shape, tensor), crc);
  }

  std::mutex split_mu_;
  std::set<std::string> split_temps_;  // the part-written files this rank wrote into

  // A file for positioned writes, closed (and the close checked) by Close, or on destruction.
  struct PositionedFile {
    PositionedFile(const std::string& p, int flags) : path(p), fd(Fd::OpenOrThrow(p, flags)) {}
    void WriteAt(const uint8_t* p, uint64_t n, uint64_t at) {
      while (n > 0) {
        const ssize_t w = ::pwrite(fd.get(), p, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(at));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw Error(path + ": write failed: " + (w < 0 ? std::strerror(errno) : "no progress"));
        p += w, n -= static_cast<uint64_t>(w), at += static_cast<uint64_t>(w);
      }
    }
    void Close() {
      if (fd.Close() != 0) throw Error(path + ": close failed: " + std::strerror(errno));
    }
    std::string path;
    Fd fd;
  };

  StoreCommit Commit() override {
    // The state files were renamed into place without an fsync each: one sync of the file system,
    // on every rank, makes them durable together before the manifest can name them.
    Seal(dir_);  // core/commit.h, step 3
    StoreCommit c;
    c.storage = nlohmann::json::object();
    for (const auto& s : specs_) {
      nlohmann::json f;
      for (int k = 0; k < StatesOf(s); ++k)
        f[std::string(plan::StateName(static_cast<plan::State>(k)))] = StateRelPath(s.name, static_cast<plan::State>(k));
      if (s.step) f["step"] = StepRelPath(s.name);
      c.storage[s.name] = {{"files", f}};
    }
    return c;
  }
};

}  // namespace

std::unique_ptr<AtomReader> OpenPtReader(const std::string& dir, nlohmann::json manifest) {
  return std::make_unique<PtReader>(dir, std::move(manifest));
}

std::unique_ptr<AtomWriter> CreatePtWriter(const std::string& dir, std::vector<AtomSpec> specs, shuffle::Comm&) {
  return std::make_unique<PtWriter>(dir, std::move(specs));
}

}  // namespace ucp::store
