#include "pt/pickle_text.h"

namespace ucp::pt {

size_t FirstNonUtf8Byte(std::string_view s) {
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned c = u[i];
    const size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (u[i + k] & 0xC0) == 0x80;
    if (ok && len == 3) ok = !(c == 0xE0 && u[i + 1] < 0xA0);                                   // overlong
    if (ok && len == 4) ok = !(c == 0xF0 && u[i + 1] < 0x90) && !(c == 0xF4 && u[i + 1] > 0x8F);  // overlong, > U+10FFFF
    if (!ok) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string Latin1Text(std::string_view bytes) {
  std::string text;
  for (unsigned char c : bytes) {
    if (c < 0x80) {
      text += static_cast<char>(c);
    } else {
      text += static_cast<char>(0xC0 | (c >> 6));
      text += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return text;
}

std::optional<std::string> Latin1Bytes(std::string_view s) {
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    auto c = static_cast<uint8_t>(s[k]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c & 0xE0) == 0xC0 && k + 1 < s.size()) {
      out.push_back(static_cast<char>(((c & 0x1F) << 6) | (static_cast<uint8_t>(s[k + 1]) & 0x3F)));
      ++k;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace ucp::pt
