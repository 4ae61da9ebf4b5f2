// The name ucp-reshard's messages begin with ("ucp-reshard: error: ..."), for every step of it.
#pragma once

namespace ucp::reshard {

inline constexpr const char* kTool = "ucp-reshard";

}  // namespace ucp::reshard
