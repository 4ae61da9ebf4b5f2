// The plan of a target made of whole tensors (a model for inference, such as Hugging Face's
// safetensors): files, each a list of tensors, each tensor a run of rows of one atomic tensor's fp32
// weights in the target's dtype. The target driver names and cuts the tensors and says what each
// file looks like (formats/driver.h); reshard/export.h spreads the files over the ranks, reads the
// rows and commits the folder. No optimizer state travels: a model is its weights.
#pragma once

#include <cstdint>
#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucp::reshard {

// One tensor of the target: rows [row_begin, row_end) of atomic tensor `atom` (an index into
// Source::atoms; a 1-D tensor's rows are its elements), of shape `shape` in the target.
struct ExportTensor {
  std::string name;
  int atom = -1;
  std::string source;  // the atomic tensor's name
  int64_t row_begin = 0, row_end = 0;
  std::vector<int64_t> shape;
  // >= 0: the atomic tensor stacks the layers on its leading axis (Megatron-Core's decoder.layers.*),
  // and the rows are those of this layer (the atomic tensor's dimension 1).
  int64_t layer = -1;
  // >= 0 (with `layer`): the atomic tensor stacks experts after the layers (Megatron-Core's
  // decoder.layers.mlp.experts.experts.*, [layers, experts, rows, ...]): the rows are this expert's (dimension 2).
  int64_t expert = -1;
  // > 0: the rows are taken `block` at a time, `stride` apart, from row_begin up to row_end (one
  // query group's share of a fused QKV after another's): target row r is atomic row
  // row_begin + (r / block) * stride + r % block. 0: rows [row_begin, row_end) in order.
  int64_t block = 0, stride = 0;
  // > 0: the rows are re-ordered inside each block of this many (a head of a query or key
  // projection): the atomic tensor's rotary pairs interleaved (2i, 2i + 1: Meta's and torchtitan's
  // rotary) become the target's halves (i, i + d/2: Hugging Face's rotate-half). 0: rows as they are.
  int64_t rotary_head_dim = 0;
  // > 0: the rows come in parts of `part_rows` each, part k's taken (by the block rule) from
  // row_begin + k * part_step: a fused [q; k; v] tensor whose atomic rows interleave head by head
  // (Megatron's [heads, 3, head_dim]) is q's rows of every head, then k's, then v's.
  int64_t part_rows = 0, part_step = 0;
  // The target (2-D) is the transpose of the rows selected: shape [columns, rows selected] (a
  // Conv1D weight, GPT-2's, is [in, out], a Linear's transpose). Written from the tensor's rows whole.
  bool transposed = false;
  // With rotary_head_dim: the other way, the atomic tensor's halves become the target's interleaved
  // pairs (Megatron's rotate-half to torchtitan's).
  bool rotary_to_pairs = false;
  // The atomic tensor's state the values are: 0 the fp32 weights, 1 exp_avg, 2 exp_avg_sq (plan::State).
  int state = 0;
  // Non-empty: the item is the box of the target tensor (`shape`) at these offsets, of these sizes
  // (a DCP chunk: one rank's shard); every dimension given.
  std::vector<int64_t> box_offsets{}, box_sizes{};
  // With `layer` and a box: the chunk is saved with the stacked tensor's layer axis, shape [1, box...]
  // (a Megatron-Core torch_dist chunk of decoder.layers.*).
  bool layer_axis = false;
  // The values' dtype as saved where it is not the plan's (fp32, bf16 or fp16; empty: the plan's):
  // a Megatron-Core model key in the job's dtype beside its fp32 optimizer state.
  std::string dtype{};
  // atom < 0: the item is these bytes as they are (a DCP bytes item's or a step's torch.save file).
  std::string payload{};
  int64_t numel() const;  // the box's, where there is one
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  // The rows selected from the atomic tensor (ForEachAtomRun's range): the target's rows, or its
  // columns when it is transposed.
  int64_t source_rows() const { return transposed ? shape.at(1) : rows(); }
};

// Rows [begin, end) of atom `atom` as the target's tensor `name` of `shape`, every other field its default.
ExportTensor RowsAsTensor(std::string name, int atom, int64_t begin, int64_t end, std::vector<int64_t> shape);

// The atomic rows that selected rows [a, b) of `t` are (source_rows()), as runs in order:
// fn(first atomic row, rows).
template <class Fn>
void ForEachAtomRun(const ExportTensor& t, int64_t a, int64_t b, Fn&& fn) {
  if (t.part_rows > 0) {  // part by part, each from its own first row
    for (int64_t r = a; r < b;) {
      const int64_t part = r / t.part_rows, end = std::min(b, (part + 1) * t.part_rows);
      ExportTensor one = t;
      one.part_rows = 0, one.row_begin = t.row_begin + part * t.part_step;
      ForEachAtomRun(one, r - part * t.part_rows, end - part * t.part_rows, fn);
      r = end;
    }
    return;
  }
  if (t.block <= 0) {
    if (b > a) fn(t.row_begin + a, b - a);
    return;
  }
  for (int64_t r = a; r < b;) {
    const int64_t in_block = r % t.block, n = std::min(t.block - in_block, b - r);
    fn(t.row_begin + (r / t.block) * t.stride + in_block, n);
    r += n;
  }
}

// Rows [0, n) of the target tensor `t` from the same rows of the atomic tensor in its order (`in`,
// `per_row` values each; n a multiple of t.rotary_head_dim where that is set) into `out`; rotary
// pairs interleaved to halves, or halves to pairs (rotary_to_pairs). A transposed tensor: `in` is
// every selected row (n = source_rows(), per_row its columns), `out` the whole target.
void ToTargetRowOrder(const ExportTensor& t, const float* in, float* out, int64_t n, int64_t per_row);

// One file of the target: its tensors in the order their bytes lie in it.
struct ExportFile {
  std::string name;             // relative to the output folder
  std::vector<int> tensors;     // indices into ExportPlan::tensors
  int64_t bytes = 0;            // the file's size
};

struct ExportPlan {
  std::string dtype;                // fp32, bf16 or fp16: every tensor's
  std::string job_dtype;            // what the source job trained in, where the driver knows it better than the manifest
  std::vector<ExportTensor> tensors;
  std::vector<ExportFile> files;
  // Small files rank 0 writes after every rank's files are durable, in order (a model's config),
  // then the marker: the commit point, the file a reader opens first (an index of the files).
  std::vector<std::pair<std::string, std::string>> side_files;
  std::string marker, marker_text;
  std::string model;                // what the target is, for messages ("LlamaForCausalLM")
  std::vector<std::string> notes;   // facts derived rather than read, printed by rank 0
  int64_t tensor_bytes() const;
};

// What a user asks of a whole-tensor target.
struct ExportOptions {
  std::string dtype;                  // empty: the source job's
  int64_t max_file_bytes = 5'000'000'000;  // a file holds at most this many tensor bytes (one tensor larger alone)
  nlohmann::json model_config;        // facts the checkpoint does not hold (--model-config), an object
  std::string model_config_path;      // where they came from, for messages
  std::string model_config_text;      // the file's bytes (a Hugging Face config.json is carried as it is)
  std::string mesh;                   // --mesh (DCP): "dp=N" or "tp=M"; empty: one rank
  std::string output;                 // -o as given, for a target that records it (DCP's checkpoint_id)
  int64_t tp = 1, pp = 1, dp = 1;     // --tp, --pp, --dp (Megatron-Core's layout)
  bool dp_given = false;              // --dp given (else 1)
  int64_t ep = 0;                     // --ep (Megatron-Core's experts); 0: the source's
  int64_t vocab_divisible_by = 0;     // --make-vocab-size-divisible-by (for Megatron-LM's job); 0: the source's args
  bool weights_only = false;          // --weights-only: the model alone, whatever optimizer state the source holds
  bool distributed_optimizer = false; // --use-distributed-optimizer: another family's optimizer state in that form
  // The training run's folder where the atomic checkpoint is a scratch conversion of it, removed when the
  // run ends: the job's files it carries (job/config.json) are named as the run's own, not the copy's.
  std::string job_files_from;
};

// Where a whole-tensor writer takes its values: rows [a, b) of atomic tensor `atom`'s state `state`
// (ExportTensor::state; 0 the fp32 weights) of its layer `layer` where it stacks layers
// (ExportTensor::layer; else -1) and of its expert `expert` where it stacks experts after the layers
// (ExportTensor::expert; else -1), columns [c0, c1) of each (c1 < 0: all of them).
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual void Read(int atom, int64_t layer, int64_t expert, int state, int64_t a, int64_t b, int64_t c0, int64_t c1, float* dst) = 0;
  // Target rows [a, b) of `t` (ForEachAtomRun), `per_row` values each, into dst; or of each row only
  // columns [c0, c1) (a DCP chunk of a column-sharded tensor), per_row then being c1 - c0.
  void ReadRows(const ExportTensor& t, int64_t a, int64_t b, int64_t per_row, float* dst, int64_t c0 = 0, int64_t c1 = -1);
};

// The bytes of `dtype` per element (4 or 2); throws ucp::Error for another name.
int ElementBytes(const std::string& dtype);

// Files filled in order, a new one begun when the next tensor would pass `max_bytes` (a tensor larger
// than that alone); `name(i, n)` names file i of n. Each file's size is left to the driver.
std::vector<ExportFile> CutIntoFiles(const ExportPlan& P, int64_t max_bytes,
                                     const std::function<std::string(int, int)>& name);

// The files as --plan-only --json prints them, with the rank that writes each.
nlohmann::json ExportPlanJson(const ExportPlan& P, const std::vector<int>& owner);

}  // namespace ucp::reshard
