// ucp-convert: a source checkpoint to an atomic checkpoint, as a MapReduce over the ranks of a
// Comm (DESIGN.md section 1): index and plan on every rank, map / shuffle / union in bounded
// rounds, writes by a pool of threads, then rank 0 commits the manifest.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "formats/driver.h"
#include "shuffle/comm.h"

namespace ucp::convert {

struct ConvertOptions {
  std::string source, output;
  std::vector<std::string> pattern_files;  // --patterns; empty: detect from patterns_dir
  std::string patterns_dir;
  bool strict = true;
  bool force = false, resume = false;
  bool removed_on_failure = false;  // the caller removes the output when the run fails (ucp-reshard's own conversions)
  bool plan_only = false, json = false;
  bool quiet = false;
  bool progress = false;     // a live progress line on rank 0 (the app sets it when stderr is a terminal)
  int threads = 0;           // writer threads per rank; 0: the cores the rank may use
  int64_t buffer_bytes = int64_t{128} << 20;  // shuffle bytes in flight per rank
  int64_t split_above = -1;  // --split-above: bytes; a larger (parameter, state) is written in parts by several ranks; 0 never, < 0 auto
  std::string report_path;   // --report: JSON with timings and bytes
  int plan_ranks = 0;        // --plan-only for this many ranks (0: the communicator's)
  std::string format = "pt";  // --format: the store the tensors go to, "pt" or "hdf5" (store/atom_store.h)
  std::string from_atomic;    // --from-atomic: convert this atomic checkpoint to `format` (no source)
  // The fp32 weights alone, a weights-only atomic checkpoint (its manifest says so): no moment read,
  // no optimizer state file written; what a weights-only target's scratch conversion needs
  // (ucp-reshard ROOT -o OUT --format hf). The same checks of what is read.
  bool weights_only = false;
  // With weights_only, for a scratch read once and removed (ucp-reshard from a training root): where
  // every parameter is its partitions' elements as they are (TP = 1, nothing tied, compared or summed),
  // no tensor is written: the scratch's manifest names where the weights lie in the source
  // (reference.cpp, the partitions store). Otherwise a conversion as above.
  bool reference = false;
  // `source` is an atomic checkpoint of another family (Megatron-Core, torchtitan), converted into one
  // of Megatron-DeepSpeed's GPTModel parameters with its optimizer state (formats::AtomicAsDeepSpeedSource):
  // what ucp-reshard writes a DeepSpeed layout of such a checkpoint from.
  bool as_deepspeed = false;
  std::string model_config_path, model_config_text;  // with as_deepspeed: ucp-reshard's --model-config, its bytes
};

// Exit codes: 0 done, 1 failed (every rank returns the same code; the lowest failing rank prints
// the reason, naming file, rank coordinates and parameter).
int RunConvert(const ConvertOptions& options, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

// A model of whole tensors (a Hugging Face model folder, the driver's read_param): its weights as a
// weights-only atomic checkpoint (from_model.cpp), with the Adam moments and step where the driver
// reads them (read_state). RunConvert hands such a source here.
int RunConvertFromModel(const ConvertOptions& options, const formats::SourceDriver& driver, shuffle::Comm& comm,
                        std::ostream& out, std::ostream& err);

// --from-atomic: an atomic checkpoint of either store to `options.format`, tensors byte for byte,
// the non-tensor files copied, parameters spread over the ranks by bytes. Same exit codes and the
// same --force rule; the source folder is only read.
int RunConvertFromAtomic(const ConvertOptions& options, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

}  // namespace ucp::convert
