// One round of an all-to-all byte exchange, the bookkeeping ucp-convert's shuffle and
// ucp-reshard's shared-piece exchange both need: how many bytes go to and come from each rank,
// where they sit in the send and receive buffers (kept from round to round), and cursors that fill
// the send buffer and drain the receive buffer in the order both sides derive from their plan.
//
//   round.Reset();  CountSend(to, n) / CountReceive(from, n) for every transfer;  Allocate();
//   Put(to, n) for each outgoing piece, in plan order;  Exchange(comm);
//   Take(from, n) for each incoming piece, in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer_pool.h"
#include "shuffle/comm.h"

namespace ucp::shuffle {

class Round {
 public:
  explicit Round(int ranks);

  void Reset();  // every count zero
  void CountSend(int to, int64_t bytes) { send_count_[to] += bytes; }
  void CountReceive(int from, int64_t bytes) { recv_count_[from] += bytes; }
  // Displacements from the counts, buffers large enough, cursors at the start of each rank's part.
  void Allocate();
  // The next `bytes` of the send buffer's part for rank `to`. Throws ucp::Error (internal) past
  // what CountSend announced.
  uint8_t* Put(int to, int64_t bytes);
  // Collective: every rank's parts to their ranks (Comm::Alltoallv).
  void Exchange(Comm& comm);
  // The next `bytes` received from rank `from`. Throws ucp::Error (internal) past what
  // CountReceive announced.
  const uint8_t* Take(int from, int64_t bytes);

  int64_t sent() const;      // bytes this rank sends in the round
  int64_t received() const;  // bytes it receives

 private:
  int ranks_;
  std::vector<int64_t> send_count_, send_displ_, recv_count_, recv_displ_, put_, take_;
  ScratchBytes send_, recv_;
};

}  // namespace ucp::shuffle
