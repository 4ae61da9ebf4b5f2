// Errors that say where and what: every layer adds its context (file, rank, parameter) in front of
// the message it caught instead of replacing it.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace ucp {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// Throws Error("context: inner message") for any std::exception raised by fn; a message that
// already begins with the context (an error naming the same file) is passed on as it is.
template <typename Fn>
auto WithContext(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    const std::string inner = e.what();
    if (inner.rfind(context + ":", 0) == 0) throw Error(inner);
    throw Error(context + ": " + inner);
  }
}

}  // namespace ucp
