// The text forms a pickle carries: a str's bytes, which Python's pickle writes as UTF-8 (surrogates
// passed through, as its 'surrogatepass' does), and protocol 2's bytes, which have no opcode of
// their own and are written as _codecs.encode(<the bytes as latin-1 text>, 'latin1').
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ucp::pt {

// The offset of the first byte of `s` that does not continue a UTF-8 sequence (overlong forms and
// code points above U+10FFFF refused), or std::string_view::npos for UTF-8 text.
size_t FirstNonUtf8Byte(std::string_view s);

// `bytes` as latin-1 text in UTF-8: each byte one code point.
std::string Latin1Text(std::string_view bytes);

// The bytes latin-1 text in UTF-8 stands for; nullopt where a character lies outside latin-1.
std::optional<std::string> Latin1Bytes(std::string_view text);

}  // namespace ucp::pt
