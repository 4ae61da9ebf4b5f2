// The safetensors container (huggingface/safetensors, docs "format"): an 8-byte little-endian header
// length N, N bytes of JSON (each tensor's dtype, shape and [begin, end) byte offsets into the data
// that follows, plus "__metadata__"), padded with spaces to a multiple of 8, then the tensors' bytes,
// contiguous, in offset order. The header depends on the plan alone, so every file's size is known
// before a byte is written, and each rank writes its files on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "layout/export_plan.h"

namespace ucp::formats::hf {

// File `f`'s length prefix and header.
std::string SafetensorsHeader(const reshard::ExportPlan& P, const reshard::ExportFile& f);

// File `f` at `path` (under a temporary name, renamed into place, no fsync: the caller seals), each
// tensor read in runs of rows and converted to the plan's dtype (rounding to nearest even).
void WriteSafetensors(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path);

// model.safetensors.index.json: metadata.total_size (the tensors' bytes) and weight_map; with
// `total_parameters` > 0 that too, as save_pretrained writes it (the model's parameter count).
std::string SafetensorsIndex(const reshard::ExportPlan& P, int64_t total_parameters = 0);

}  // namespace ucp::formats::hf
