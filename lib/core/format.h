// Small text formats shared by the reports of every tool.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace ucp {

// "0 B", "37.5 KiB", "1.6 GiB": binary units, one decimal above bytes.
std::string HumanBytes(double bytes);

// "2026-11-23T14:05:09Z": the current time, UTC, to the second.
std::string UtcTimestamp();
// The time a written checkpoint records: SOURCE_DATE_EPOCH (seconds since 1970) when the
// environment sets it, so that two runs on the same input write the same bytes; else now.
std::string OutputTimestamp();

// "a, b, c": the texts of `names` joined by `separator`; `text` gives an element's text (by default
// the element, a string or anything a string appends).
template <class Range, class Text = std::identity>
std::string JoinNames(const Range& names, std::string_view separator = ", ", Text text = {}) {
  std::string out;
  bool first = true;
  for (const auto& n : names) {
    if (!first) out += separator;
    out += std::invoke(text, n);
    first = false;
  }
  return out;
}

}  // namespace ucp
