// The files of split items completed after the rounds: every part's CRC-32 and XXH64 go to every
// rank (a slot each, in plan order); the rank of one part of a file (the state's number modulo the
// parts: the three states of a parameter are finished by different ranks) completes it (the
// tensor's CRC-32 combined from its parts', in row order) and renames it into place, so the files
// are finished in parallel.
#include <zlib.h>

#include "convert/steps.h"
#include "core/error.h"
#include "shuffle/agree.h"

namespace ucp::convert {
using plan::Item;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

using PartKey = std::tuple<int, int, int>;  // (param, state, part)

// Every split item's part in the plan: its slot among the exchanged digests, and the item, whose
// rows of the atomic tensor (out_begin, out_numel) the part holds.
struct PartSlot {
  size_t slot = 0;
  const Item* item = nullptr;
};

std::map<PartKey, PartSlot> PartSlots(const plan::ConvertPlan& plan) {
  std::map<PartKey, PartSlot> slots;
  for (const auto& work : plan.work)
    for (const Item& it : work)
      if (it.split()) slots.emplace(PartKey{it.param, static_cast<int>(it.state), it.part}, PartSlot{slots.size(), &it});
  return slots;
}

// Per slot: 2^32 + the CRC-32 once written, then the XXH64 (each slot written by one rank only);
// summed over the ranks, every rank has every part's.
std::vector<int64_t> PartDigests(const std::map<PartKey, PartSlot>& slots, const PartsWritten& parts_written) {
  std::vector<int64_t> sums(2 * slots.size(), 0);
  for (const auto& [key, d] : parts_written) {
    const size_t k = slots.at(key).slot;
    sums[2 * k] = (int64_t{1} << 32) + d.crc32, sums[2 * k + 1] = static_cast<int64_t>(d.xxh64);
  }
  return sums;
}

// Completes the file of `it`'s (parameter, state) from every part's digests.
void FinishFile(const plan::ConvertPlan& plan, const Item& it, const std::map<PartKey, PartSlot>& slots,
                const std::vector<int64_t>& sums, store::AtomWriter& writer, store::Journal& journal, RankOutput& out) {
  const auto& P = plan.params[it.param];
  uint32_t crc = 0;
  std::vector<store::AtomWriter::WrittenPart> parts;
  for (int k = 0; k < it.parts; ++k) {
    const PartSlot& part = slots.at({it.param, static_cast<int>(it.state), k});
    const size_t at = part.slot;
    if (sums[2 * at] >> 32 != 1)
      throw Error("internal: '" + P.name + "' " + std::string(plan::StateName(it.state)) + ": part " + std::to_string(k) + " not written");
    const auto part_crc = static_cast<uint32_t>(sums[2 * at] & 0xFFFFFFFF);
    crc = k == 0 ? part_crc : static_cast<uint32_t>(crc32_combine64(crc, part_crc, 4 * part.item->out_numel));
    parts.push_back({part.item->out_begin, part.item->out_numel, static_cast<uint64_t>(sums[2 * at + 1])});
  }
  const auto recs = writer.FinishParts(P.name, it.state, crc, parts);
  for (const auto& r : recs) journal.Append(r);
  out.Record(recs);
  std::lock_guard<std::mutex> lock(out.mu);
  out.c.bytes_written -= 4 * P.full_numel;  // the tensor's bytes, counted by the ranks that wrote its parts
}

}  // namespace

bool FinishSplitParts(const plan::ConvertPlan& plan, const PartsWritten& parts_written, store::AtomWriter& writer,
                      store::Journal& journal, shuffle::Comm& comm, std::ostream& err, RankOutput& out) {
  const auto slots = PartSlots(plan);
  std::vector<int64_t> sums = PartDigests(slots, parts_written);
  if (!sums.empty()) Timed(out.c.exchange, [&] { comm.AllreduceSum(sums); });
  const std::string error = Timed(out.c.finish_parts, [&] { return Capture([&] {
    for (const Item& it : plan.work[comm.rank()])
      if (it.split() && it.part == static_cast<int>(it.state) % it.parts) FinishFile(plan, it, slots, sums, writer, journal, out);
  }); });
  return !AnyFailed(comm, error, err, "ucp-convert");
}

}  // namespace ucp::convert
