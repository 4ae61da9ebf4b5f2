// A Hugging Face model as the atomic checkpoint's parameters: Megatron-DeepSpeed's GPTModel names
// (the "plain" naming, as a real Megatron-DeepSpeed Llama save names them), shapes, optimizer groups
// and sub-parameter sizes, and for each parameter the Hugging Face tensors its rows come from. The
// rows are found by inverting the export's own table (names.h: the tensors `--format hf` cuts from
// these parameters: LlamaTensors for Llama and Mixtral, Gpt2Tensors for GPT-2), so one table serves
// both directions; the inversion reads only the export's tensor description (atom, rows, blocks,
// parts, transposed: a Conv1D weight's columns are the parameter's rows), whatever class made it,
// and checks that every row of every parameter is filled exactly once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/hf/import_config.h"
#include "layout/export_plan.h"

namespace ucp::formats::hf {

struct ImportAtom {
  std::string name;
  std::vector<int64_t> shape;
  int group = 0;                          // Megatron's: 0 weights with decay (>= 2-D), 1 biases and norms
  std::vector<int64_t> sub_param_sizes;   // a fused tensor's rows: [q, kv, kv], [ffn, ffn]
  std::vector<int> fills;                 // indices into ImportModel::tensors, in row order
};

struct ImportModel {
  std::vector<ImportAtom> atoms;               // in the manifest's order: group 0, then group 1
  std::vector<reshard::ExportTensor> tensors;  // the export's table, its atoms indices into `atoms`
};

// The import of a model of config `c` in `dir` (for messages): the parameters and the table inverted.
// Throws ucp::Error naming the parameter whose rows the table leaves unfilled or fills twice.
ImportModel ImportModelOf(const HfConfig& c, const std::string& dir);

// Parameter `a`'s values (row-major, fp32) into dst, each of its tensors read whole by
// `read(tensor, buffer)`: straight into dst where the tensor's rows are one run of dst's, else into a
// buffer of the tensor's elements. Memory: at most one tensor beside dst.
void FillAtom(const ImportModel& M, size_t a, const std::function<void(const reshard::ExportTensor&, float*)>& read, float* dst);

}  // namespace ucp::formats::hf
