// The checksum libraries ucp could use, timed on the same buffer: zlib's crc32 against libdeflate's
// (CRC-32, every byte ucp reads from a zip), and the xxHash library's XXH64 (every byte it writes),
// against a memcpy of the same bytes as the floor. Paired and alternating, medians of the rounds;
// scripts/bench_checksums.sh runs it. Prints one line per function: median GB/s and the spread.
#include <libdeflate.h>
#include <xxhash.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  std::vector<unsigned char> a(mib << 20), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  volatile uint64_t sink = 0;
  struct Fn {
    const char* name;
    std::function<uint64_t()> run;
    std::vector<double> gbs;
  };
  std::vector<Fn> fns = {
      {"memcpy (floor)", [&] { std::memcpy(b.data(), a.data(), a.size()); return uint64_t{b[a.size() / 2]}; }, {}},
      {"zlib crc32", [&] {
         uLong c = 0;
         for (size_t off = 0; off < a.size(); off += 1u << 30)
           c = crc32(c, a.data() + off, static_cast<uInt>(std::min<size_t>(a.size() - off, 1u << 30)));
         return uint64_t{c};
       }, {}},
      {"libdeflate_crc32", [&] { return uint64_t{libdeflate_crc32(0, a.data(), a.size())}; }, {}},
      {"XXH64 (libxxhash)", [&] { return uint64_t{XXH64(a.data(), a.size(), 0)}; }, {}},
  };
  if (static_cast<uint32_t>(fns[1].run()) != static_cast<uint32_t>(fns[2].run())) {
    std::fprintf(stderr, "zlib and libdeflate disagree on the CRC-32\n");
    return 1;
  }
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < fns.size(); ++k) {
      Fn& f = fns[(k + r) % fns.size()];  // a different order each round
      auto t0 = std::chrono::steady_clock::now();
      sink = sink + f.run();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      f.gbs.push_back(a.size() / s / 1e9);
    }
  std::printf("%zu MiB buffer, %d alternating rounds\n%-20s %10s %10s %10s\n", mib, rounds, "function", "median", "min", "max");
  for (auto& f : fns) {
    std::sort(f.gbs.begin(), f.gbs.end());
    std::printf("%-20s %7.2f GB/s %6.2f GB/s %6.2f GB/s\n", f.name, f.gbs[f.gbs.size() / 2], f.gbs.front(), f.gbs.back());
  }
  return 0;
}
