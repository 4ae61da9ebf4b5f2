// CopyFileAtomically, the copy of a carried file (a DeepSpeed model-states file): byte for byte,
// hashed as the manifest records it, every zip record checked against its CRC-32 as it passes, and
// nothing left behind when a check fails. The CRC-32s here come from zlib, not from the library the
// copy uses (libdeflate). On a file system with reflinks (UCP_TEST_REFLINK_DIR, e.g. an XFS mount)
// the copy must also share the source's extents rather than copy them.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/xxhash64.h"
#include "store/atomic_store.h"
#include "test_support.h"

using namespace ucp;
namespace fs = std::filesystem;

namespace {

// A file of random bytes spanning several read blocks, with three "records" over parts of it.
struct CopiedFile {
  fs::path path;
  std::string bytes;
  std::vector<source::ChecksummedRange> records;
};

CopiedFile MakeSource(const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir / "out");
  CopiedFile s{dir / "model_states.pt", std::string((20 << 20) + 12345, '\0'), {}};
  std::mt19937_64 rng(7);
  for (auto& c : s.bytes) c = static_cast<char>(rng());
  std::ofstream(s.path, std::ios::binary).write(s.bytes.data(), static_cast<std::streamsize>(s.bytes.size()));
  for (auto [name, offset, size] : {std::tuple{"a/data/0", 64, 1000}, std::tuple{"a/data/1", (8 << 20) - 100, 5 << 20},
                                    std::tuple{"a/data/2", (20 << 20), 12345}}) {
    const auto* p = reinterpret_cast<const Bytef*>(s.bytes.data()) + offset;
    s.records.push_back({name, static_cast<uint64_t>(offset), static_cast<uint64_t>(size),
                         static_cast<uint32_t>(crc32(0, p, static_cast<uInt>(size)))});
  }
  return s;
}

bool OnlyTheSource(const fs::path& dir) {  // nothing was written into out/, not even a temporary
  return fs::is_empty(dir / "out");
}

// Whether every extent of the file is shared with another file (a reflink), by FIEMAP.
bool AllExtentsShared(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::vector<char> buf(sizeof(fiemap) + 256 * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  fm->fm_length = ~0ULL, fm->fm_flags = FIEMAP_FLAG_SYNC, fm->fm_extent_count = 256;
  const int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  ::close(fd);
  REQUIRE(rc == 0);
  REQUIRE(fm->fm_mapped_extents > 0);
  for (unsigned i = 0; i < fm->fm_mapped_extents; ++i)
    if (!(fm->fm_extents[i].fe_flags & FIEMAP_EXTENT_SHARED)) return false;
  return true;
}

void CheckCopy(const fs::path& dir) {
  const CopiedFile s = MakeSource(dir);
  const auto r = store::CopyFileAtomically(s.path, dir / "out", "copy.pt", Durability::Batch, s.records);
  CHECK(r.path == "copy.pt");
  CHECK(r.bytes == s.bytes.size());
  CHECK(r.xxh64 == XxHash64::Of(s.bytes.data(), s.bytes.size()));
  CHECK(test::ReadText(dir / "out" / "copy.pt") == s.bytes);
}

}  // namespace

TEST_CASE("copy: a carried file is copied byte for byte and hashed as the manifest records it", "[copy]") {
  CheckCopy(test::WorkDir() / "copy_plain");
}

TEST_CASE("copy: a record whose bytes do not give its CRC-32 is refused by name, and nothing is left", "[copy]") {
  const fs::path dir = test::WorkDir() / "copy_bad_crc";
  for (size_t k = 0; k < 3; ++k) {
    CopiedFile s = MakeSource(dir);
    s.records[k].crc32 ^= 1;
    try {
      store::CopyFileAtomically(s.path, dir / "out", "copy.pt", Durability::Batch, s.records);
      FAIL("a damaged record was copied");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(s.path.string()) && Catch::Contains(s.records[k].name) &&
                               Catch::Contains("CRC-32 mismatch") && Catch::Contains("not copied"));
    }
    CHECK(OnlyTheSource(dir));
  }
}

TEST_CASE("copy: a record the file ends inside is refused as a truncation, and nothing is left", "[copy]") {
  const fs::path dir = test::WorkDir() / "copy_truncated";
  CopiedFile s = MakeSource(dir);
  s.records.back().size += 1;
  CHECK_THROWS_WITH(store::CopyFileAtomically(s.path, dir / "out", "copy.pt", Durability::Batch, s.records),
                    Catch::Contains("a/data/2") && Catch::Contains("ends inside it"));
  CHECK(OnlyTheSource(dir));
}

TEST_CASE("copy: on a file system with reflinks the copy shares the source's extents", "[copy][reflink]") {
  const char* where = std::getenv("UCP_TEST_REFLINK_DIR");
  if (!where) {
    WARN("UCP_TEST_REFLINK_DIR is not set: the reflink case is not run (it needs e.g. an XFS mount)");
    return;
  }
  const fs::path dir = fs::path(where) / "ucp_copy_reflink";
  CheckCopy(dir);
  CHECK(AllExtentsShared(dir / "out" / "copy.pt"));
  fs::remove_all(dir);
}
