#include "shuffle/round.h"

#include <numeric>
#include <string>

#include "core/error.h"

namespace ucp::shuffle {

Round::Round(int ranks)
    : ranks_(ranks), send_count_(ranks, 0), send_displ_(ranks, 0), recv_count_(ranks, 0), recv_displ_(ranks, 0),
      put_(ranks, 0), take_(ranks, 0) {}

void Round::Reset() {
  std::fill(send_count_.begin(), send_count_.end(), 0);
  std::fill(recv_count_.begin(), recv_count_.end(), 0);
}

void Round::Allocate() {
  int64_t s = 0, r = 0;
  for (int k = 0; k < ranks_; ++k) {
    send_displ_[k] = s, recv_displ_[k] = r;
    s += send_count_[k], r += recv_count_[k];
  }
  send_.Reserve(static_cast<size_t>(s));
  recv_.Reserve(static_cast<size_t>(r));
  put_ = send_displ_;
  take_ = recv_displ_;
}

uint8_t* Round::Put(int to, int64_t bytes) {
  if (put_[to] + bytes > send_displ_[to] + send_count_[to])
    throw Error("internal: the exchange round packs more for rank " + std::to_string(to) + " than it counted");
  uint8_t* at = send_.data() + put_[to];
  put_[to] += bytes;
  return at;
}

void Round::Exchange(Comm& comm) {
  comm.Alltoallv(send_.data(), send_count_, send_displ_, recv_.data(), recv_count_, recv_displ_);
  take_ = recv_displ_;
}

const uint8_t* Round::Take(int from, int64_t bytes) {
  if (take_[from] + bytes > recv_displ_[from] + recv_count_[from])
    throw Error("internal: the exchange round unpacks more from rank " + std::to_string(from) + " than it received");
  const uint8_t* at = recv_.data() + take_[from];
  take_[from] += bytes;
  return at;
}

int64_t Round::sent() const { return std::accumulate(send_count_.begin(), send_count_.end(), int64_t{0}); }
int64_t Round::received() const { return std::accumulate(recv_count_.begin(), recv_count_.end(), int64_t{0}); }

}  // namespace ucp::shuffle
