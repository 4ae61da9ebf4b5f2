#include "core/names.h"

#include <cstdio>

#include "core/error.h"

namespace ucp {
namespace {

constexpr size_t kMaxName = 255, kMaxPath = 4096;

// Why `name` is not one plain component, or "" when it is.
std::string NameProblem(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "is '" + name + "'";
  if (name.find('/') != std::string::npos) return "holds a '/'";
  if (name.find('\0') != std::string::npos) return "holds a NUL byte";
  if (name.size() > kMaxName) return "is " + std::to_string(name.size()) + " bytes long (at most " + std::to_string(kMaxName) + ")";
  return "";
}

std::string PathProblem(const std::string& path) {
  if (path.empty()) return "is empty";
  if (path.size() > kMaxPath) return "is " + std::to_string(path.size()) + " bytes long (at most " + std::to_string(kMaxPath) + ")";
  if (path[0] == '/') return "is absolute";
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (auto p = NameProblem(part); !p.empty()) return "has a component that " + p;
    if (slash == std::string::npos) return "";
    start = slash + 1;
  }
}

// The name as a message shows it: printable ASCII as is, other bytes as \xNN, cut after 80 bytes.
std::string Shown(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

}  // namespace

bool IsPlainName(const std::string& name) { return NameProblem(name).empty(); }
bool IsPlainRelativePath(const std::string& path) { return PathProblem(path).empty(); }

void RequirePlainName(const std::string& name, const std::string& what) {
  if (auto p = NameProblem(name); !p.empty())
    throw Error(what + " '" + Shown(name) + "' " + p + ": it cannot be a file or folder name");
}

void RequirePlainRelativePath(const std::string& path, const std::string& what) {
  if (auto p = PathProblem(path); !p.empty())
    throw Error(what + " '" + Shown(path) + "' " + p + ": it would name a file outside its folder");
}

}  // namespace ucp
