// Small text formats shared by the reports of every tool.
#pragma once

#include <string>

namespace ucp {

// "0 B", "37.5 KiB", "1.6 GiB": binary units, one decimal above bytes.
std::string HumanBytes(double bytes);

}  // namespace ucp
