// Agreeing on failure across ranks: every rank reaches the same collective with its own error (or
// none); if any rank failed, all of them stop, and the lowest failing rank prints why.
#pragma once

#include <ostream>
#include <string>

#include "shuffle/comm.h"

namespace ucp::shuffle {

// Runs fn, returning the message of what it threw ("" when it did not throw).
template <typename Fn>
std::string Capture(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Collective: true when any rank has an error; the lowest such rank prints "<tool>: error ...".
inline bool AnyFailed(Comm& comm, const std::string& error, std::ostream& err, const char* tool) {
  int64_t v = error.empty() ? 0 : comm.size() - comm.rank();
  comm.AllreduceMax({&v, 1});
  if (v == 0) return false;
  if (!error.empty() && comm.size() - comm.rank() == v) {
    err << tool << ": error";
    if (comm.size() > 1) err << " (rank " << comm.rank() << ")";
    err << ": " << error << std::endl;
  }
  return true;
}

}  // namespace ucp::shuffle
