// The partitions store: a weights-only atomic checkpoint whose fp32 tensors stay where the training
// checkpoint keeps them, in its optimizer files' flat partitions. A run's scratch only (ucp-reshard
// from a training root to a target of the weights alone: convert/reference.cpp writes it, never
// ucp-convert's -o): its manifest gives each parameter's runs of elements as byte ranges of the
// source's files, and the zip records they lie in with their CRC-32s. A record is read whole and
// checked the first time a slab touches it, as the conversion's mapper checks it: a flipped byte is
// refused naming the file and the record, never exported. The source files are read by pread; none
// stays mapped.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/file_descriptor.h"
#include "pt/record_crc.h"
#include "pt/zip_archive.h"
#include "store/atom_store.h"

namespace ucp::store {
namespace {

struct Run {
  int file = 0;           // into PartitionsReader::files_
  int64_t at = 0, numel = 0;  // atom elements [at, at + numel)
  uint64_t offset = 0;    // the byte of element `at` in the file
};

struct Record {
  uint64_t offset = 0, size = 0;
  uint32_t crc32 = 0;
  std::string name;
};

struct SourceFile {
  std::string path;
  std::vector<Record> records;  // in byte order
  Fd fd;                        // opened on first use, under PartitionsReader::mu_
  std::unique_ptr<std::once_flag[]> checked;  // per record: its CRC-32 checked once, by the first reader
};

class PartitionsReader final : public AtomReader {
 public:
  PartitionsReader(const std::string& dir, nlohmann::json manifest) : AtomReader(StoreKind::Partitions, dir, std::move(manifest)) {
    WithContext(dir + "/" + kManifestName, [&] {
      if (!weights_only()) throw Error("a partitions store holds weights only (source.weights_only)");
      const auto& files = this->manifest().at("partition_files");
      for (const auto& f : files) {
        SourceFile s;
        s.path = f.at("path").get<std::string>();
        for (const auto& r : f.at("records"))
          s.records.push_back({r.at("offset").get<uint64_t>(), r.at("size").get<uint64_t>(), r.at("crc32").get<uint32_t>(),
                               r.at("name").get<std::string>()});
        if (!std::is_sorted(s.records.begin(), s.records.end(), [](const Record& a, const Record& b) { return a.offset < b.offset; }))
          throw Error(s.path + ": its records are not in byte order");
        s.checked = std::make_unique<std::once_flag[]>(s.records.size());
        files_.push_back(std::move(s));
      }
      for (const auto& p : this->manifest().at("params")) {
        const std::string name = p.at("name").get<std::string>();
        auto& runs = runs_[name];
        int64_t next = 0;
        for (const auto& r : p.at("partitions")) {
          Run run{r.at("file").get<int>(), r.at("at").get<int64_t>(), r.at("numel").get<int64_t>(), r.at("offset").get<uint64_t>()};
          if (run.file < 0 || static_cast<size_t>(run.file) >= files_.size() || run.at != next || run.numel <= 0)
            throw Error("parameter '" + name + "': its partitions do not tile it in order");
          next += run.numel;
          runs.push_back(run);
        }
        if (next != param(name).numel) throw Error("parameter '" + name + "': its partitions hold " + std::to_string(next) +
                                                  " of its " + std::to_string(param(name).numel) + " elements");
      }
    });
  }

  void ReadSlab(const std::string& name, plan::State state, std::span<const int64_t> start, std::span<const int64_t> count,
                float* dst) override {
    const AtomParam& p = param(name);
    CheckSlab(p, state, start, count);
    const int64_t n = pt::Numel({count.begin(), count.end()});
    if (n == 0) return;
    if (auto first = ContiguousSlabStart(p.shape, start, count)) {
      ReadElements(name, *first, n, dst);
    } else {  // row by row of the innermost dimensions the slab covers whole
      size_t d = p.shape.size();
      int64_t run = 1;
      while (d > 0 && start[d - 1] == 0 && count[d - 1] == p.shape[d - 1]) run *= p.shape[--d];
      if (d > 0) run *= count[d - 1];
      std::vector<int64_t> index(start.begin(), start.end());
      for (int64_t done = 0; done < n; done += run) {
        int64_t at = 0;
        for (size_t k = 0; k < p.shape.size(); ++k) at = at * p.shape[k] + index[k];
        ReadElements(name, at, run, dst + done);
        for (size_t k = d - 1; k-- > 0;) {  // the next index of the outer dimensions
          if (++index[k] < start[k] + count[k]) break;
          index[k] = start[k];
        }
      }
    }
    bytes_read_ += 4 * static_cast<uint64_t>(n);
    storage_bytes_read_ += 4 * static_cast<uint64_t>(n);
  }

  pt::ValuePtr ReadStep(const std::string&) override { return nullptr; }

  UniversalKeys ReadUniversalKeys(const std::string& name) override {
    throw Error(dir() + ": parameter '" + name + "': a run's scratch of the weights alone, in the training checkpoint's "
                "partitions: it has no universal files to copy");
  }

  void Forget(const std::string&) override {}
  std::vector<int64_t> ReadBlock(const std::string&, plan::State) override { return {}; }

 private:
  // Atom elements [at, at + n) into dst, run by run.
  void ReadElements(const std::string& name, int64_t at, int64_t n, float* dst) {
    const auto& runs = runs_.at(name);
    auto it = std::upper_bound(runs.begin(), runs.end(), at, [](int64_t e, const Run& r) { return e < r.at; });
    for (--it; n > 0; ++it) {
      const int64_t skip = at - it->at, take = std::min(n, it->numel - skip);
      ReadBytes(name, files_[static_cast<size_t>(it->file)], it->offset + 4 * static_cast<uint64_t>(skip), 4 * static_cast<uint64_t>(take),
                reinterpret_cast<uint8_t*>(dst));
      dst += take, at += take, n -= take;
    }
  }

  void ReadBytes(const std::string& name, SourceFile& f, uint64_t pos, uint64_t len, uint8_t* dst) {
    const std::string what = "parameter '" + name + "' fp32";
    int fd;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (f.fd.get() < 0) {
        f.fd = Fd::OpenOrThrow(f.path, O_RDONLY);
        ::posix_fadvise(f.fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
      }
      fd = f.fd.get();
    }
    CheckRecords(f, fd, pos, len, what);
    while (len > 0) {
      const ssize_t got = ::pread(fd, dst, std::min<uint64_t>(len, 1u << 30), static_cast<off_t>(pos));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error(f.path + ": " + what + ": read failed: " + std::strerror(errno));
      if (got == 0) throw Error(f.path + ": " + what + ": the file ends at byte " + std::to_string(pos) + " (truncated?)");
      dst += got, pos += static_cast<uint64_t>(got), len -= static_cast<uint64_t>(got);
    }
  }

  // Every record bytes [pos, pos + len) lie in, read whole and checked against its CRC-32 the first
  // time (one reader a record; the others wait for it); bytes outside every record are refused.
  void CheckRecords(SourceFile& f, int fd, uint64_t pos, uint64_t len, const std::string& what) {
    const uint64_t held = pt::ForEachRecordHolding(f.records, pos, len, [&](size_t i) {
      std::call_once(f.checked[i], [&] {  // a throw leaves it unchecked: the next reader refuses it too
        const Record& r = f.records[i];
        const uint32_t crc = pt::Crc32Of(fd, r.offset, r.size, f.path, r.name);
        if (crc != r.crc32) throw pt::CrcMismatch(f.path, r.name, r.crc32, crc, "", "nothing of it was exported (" + what + " lies in it)");
      });
    });
    if (held < pos + len)
      throw Error(what + ": bytes [" + std::to_string(pos) + ", " + std::to_string(pos + len) + ") of " + f.path +
                  " lie outside every zip record");
  }

  std::mutex mu_;  // the files' descriptors
  std::vector<SourceFile> files_;
  std::map<std::string, std::vector<Run>> runs_;
};

}  // namespace

std::unique_ptr<AtomReader> OpenPartitionsReader(const std::string& dir, nlohmann::json manifest) {
  return std::make_unique<PartitionsReader>(dir, std::move(manifest));
}

}  // namespace ucp::store
