// The formats ucp reads and writes, in one table each (ADIOS2's engine table): a source driver
// turns a checkpoint folder into the neutral SourceIndex that plan, map, union and store work on;
// a target driver writes the shard files of a layout from the reshard plan. Adding a format is a
// folder under formats/ and a row here; `ucp-inspect --list-formats` prints the rows.
#pragma once

#include <ostream>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "source/source_index.h"

namespace ucp::formats {

struct SourceDriver {
  const char* name;
  const char* description;  // what it reads, which writers and variants
  const char* files;        // the file names it recognises
  // Whether `dir` (or dir/<latest>) looks like this format; cheap: names only, no file read.
  bool (*probe)(const std::string& dir);
  // The neutral index; throws ucp::Error when `dir` is not this format at all, records every other
  // finding in the index's errors / problems / notes.
  source::SourceIndex (*index)(const std::string& dir, const source::IndexOptions& options);
};

std::span<const SourceDriver> SourceDrivers();

// The index of `dir` by the first source driver whose probe accepts it. When none does, the first
// driver indexes it anyway, so that its error says what is missing.
source::SourceIndex IndexSource(const std::string& dir, const source::IndexOptions& options = {});

// Every driver, for `ucp-inspect --list-formats`.
nlohmann::json FormatsJson();
void PrintFormats(std::ostream& out);

}  // namespace ucp::formats
