// Names read from files that become names of files ucp writes or reads (parameter names, DeepSpeed
// tags, paths a manifest lists) must stay inside the folder they are joined to: one rule, here.
#pragma once

#include <string>

namespace ucp {

// One path component: not empty, not "." or "..", no '/' and no NUL, at most 255 bytes.
bool IsPlainName(const std::string& name);
// A relative path of plain components joined by '/' (no leading '/', no empty component), at most
// 4096 bytes.
bool IsPlainRelativePath(const std::string& path);

// Throw ucp::Error "<what> '<name>' ..." saying which rule it breaks (control characters shown escaped).
void RequirePlainName(const std::string& name, const std::string& what);
void RequirePlainRelativePath(const std::string& path, const std::string& what);

}  // namespace ucp
