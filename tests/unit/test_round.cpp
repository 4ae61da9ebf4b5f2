// shuffle::Round: what is put for a rank comes out of Take in the same order, after the exchange;
// packing or unpacking past the counted bytes is an internal error, not a silent overrun.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "shuffle/round.h"

using namespace ucp;

TEST_CASE("a round delivers what was put, in order, and refuses to overrun its counts", "[round]") {
  auto comm = shuffle::MakeLocalComm();
  shuffle::Round round(1);
  for (int64_t size : {8, 24, 0, 4}) {  // rounds of different sizes reuse the buffers
    round.Reset();
    round.CountSend(0, size);
    round.CountReceive(0, size);
    round.Allocate();
    std::vector<uint8_t> sent(static_cast<size_t>(size));
    for (int64_t k = 0; k < size; ++k) sent[k] = static_cast<uint8_t>(size * 7 + k);
    for (int64_t k = 0; k < size; k += 4) std::memcpy(round.Put(0, 4), sent.data() + k, 4);
    CHECK_THROWS_AS(round.Put(0, 1), Error);
    round.Exchange(*comm);
    CHECK(round.sent() == size);
    CHECK(round.received() == size);
    std::vector<uint8_t> got(static_cast<size_t>(size));
    for (int64_t k = 0; k < size; k += 4) std::memcpy(got.data() + k, round.Take(0, 4), 4);
    CHECK(got == sent);
    CHECK_THROWS_AS(round.Take(0, 1), Error);
  }
}
