// The two interfaces a format implements (ADIOS2's engines, TensorStore's drivers): a source driver
// turns a checkpoint folder into the neutral SourceIndex that plan, map, union and store work on; a
// target driver writes the shard files of a layout, unit by unit of the reshard plan. A format's
// folder (formats/<name>/) defines its rows in its driver.cpp; formats/registry.h lists them.
#pragma once

#include <string>

#include "core/buffer_pool.h"
#include "source/source_index.h"
#include "target/reshard_plan.h"

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

struct TargetDriver {
  const char* name;
  const char* description;
  const char* files;  // the file names it writes
  // The files of one unit of the reshard plan (target/reshard_plan.h) into `dir`, values from
  // `slices`; no fsync of its own (the caller syncs once, then commits with `latest`).
  reshard::UnitFiles (*write_unit)(const reshard::Source& S, const reshard::TargetLayout& T, const reshard::Plan& P,
                                   const reshard::Unit& U, reshard::SliceSource& slices, const std::string& dir,
                                   ScratchBytes& arena);
};

// The rows, each defined in its format's folder (formats/<name>/driver.cpp); the registry's tables
// list them.
const SourceDriver& DeepSpeedSource();
const TargetDriver& DeepSpeedTarget();

}  // namespace ucp::formats
