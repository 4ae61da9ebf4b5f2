// Where an atomic checkpoint's tensors live, behind one interface (DESIGN.md section 4; STYLE.md:
// formats and storage are separate axes). Two stores, registered in the one table of
// atom_store.cpp:
//   pt    DeepSpeed's universal layout: zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, one
//         torch.save file per parameter and state (what DeepSpeed's load_universal reads);
//   hdf5  one atoms.h5: a group per parameter holding the datasets fp32, exp_avg, exp_avg_sq, the
//         step and the manifest's metadata as attributes (schemas/atoms-h5.schema.json), written in
//         parallel through MPI-IO, read hyperslab by hyperslab.
// Either way zero/optimizer_state.pt, the carried-over model-states files and ucp_manifest.json
// sit in the folder; the manifest's "store" says which store holds the tensors (absent: pt), and
// each parameter's entry says where: "files" (pt) or "hdf5".
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/convert_plan.h"
#include "pt/torch_file.h"
#include "pt/value.h"
#include "shuffle/comm.h"
#include "store/atomic_store.h"

namespace ucp::store {

enum class StoreKind { Pt, Hdf5, Partitions };
std::string_view StoreName(StoreKind kind);    // "pt", "hdf5"
StoreKind StoreFromName(const std::string& name);  // throws ucp::Error listing the known stores
// A store an output may be written in (--format): pt or hdf5; partitions, a run's scratch, refused by name.
StoreKind WritableStoreFromName(const std::string& name);
StoreKind StoreOf(const nlohmann::json& manifest);
// Whether DeepSpeed's universal load resumes from the atomic checkpoint as it is: it reads the .pt
// store and the model-states file carried beside the tensors (CarriedModelStates), and the optimizer's
// state (not a weights-only checkpoint, whose optimizer is not there to resume). What decides
// whether a conversion points latest_universal at its output.
bool DeepSpeedResumes(const nlohmann::json& manifest);
// Whether a conversion into `dir` points <parent>/latest_universal at it: DeepSpeed resumes from it
// and `dir` sits in its tag's own checkpoint root, DeepSpeed's convention (the parent holds `latest`
// and the folder of the manifest's source.tag). Elsewhere a conversion writes nothing outside `dir`:
// a parent that many conversions share has no latest_universal that is one run's to move.
bool PointsLatestUniversal(const std::string& dir, const nlohmann::json& manifest);
// Whether a store writes a conversion's state tensors in parts (AtomWriter::WritePart): the .pt
// store in its plain form; not the HDF5 store, nor DeepSpeed's ZeRO-3 universal form (a zero-padded
// 1-D tensor, UniversalKeysOf) of a ZeRO-3 source.
bool WritesParts(StoreKind kind, int zero_stage);
// Every store, (name, what it is), for ucp-inspect --list-formats.
std::vector<std::pair<std::string, std::string>> StoreDescriptions();  // its "store"; absent: pt (format_version 1 folders)

inline constexpr const char* kAtomsH5 = "atoms.h5";

// An HDF5 store's atoms.h5 checked whole against the manifest's record of it (size and XXH64) before
// the HDF5 library reads a byte of it: HDF5 trusts what it reads from a file, so a damaged one would
// pass silently or fail with its raw error stack. A .pt store (each atom is hashed as it is read) and
// a folder without a ucp manifest (DeepSpeed's universal folder) pass at once. Throws ucp::Error
// naming the file. Reads the whole file: one rank calls it, before any rank opens the store.
void CheckAtomsH5Whole(const std::string& dir);
inline constexpr int kAtomsH5Version = 1;  // the layout of atoms.h5, schemas/atoms-h5.schema.json

// One parameter as the manifest describes it.
struct AtomParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::string pattern;  // "Shard-V", ... (the model pattern)
  int split_dim = -1;   // -1: not split (Replicate, Partial)
  bool split_dim_known = false, vocab = false;
  std::vector<int64_t> sub_param_sizes;
  int group = 0;
  bool has_step = false;
  nlohmann::json meta;  // the manifest entry without its storage part ("files" / "hdf5")
};

// Reads an atomic checkpoint of either store. Thread-safe; the HDF5 store needs no MPI to read
// (every rank opens atoms.h5 on its own, read-only).
class AtomReader {
 public:
  // Reads the manifest and opens the store it names; throws ucp::Error naming the file (a missing
  // or damaged atoms.h5 is refused here).
  static std::unique_ptr<AtomReader> Open(const std::string& dir);
  virtual ~AtomReader() = default;

  StoreKind store() const { return store_; }
  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const std::vector<AtomParam>& params() const { return params_; }
  const AtomParam& param(const std::string& name) const;  // throws naming the parameter
  // A weights-only atomic checkpoint (the manifest's source.weights_only: a Hugging Face model's
  // weights): its parameters have fp32 only, no Adam moments, no step, no zero/optimizer_state.pt.
  // Reading a moment of one throws ucp::Error naming the parameter.
  bool weights_only() const { return weights_only_; }
  // The states a parameter holds: fp32 alone in a weights-only checkpoint, else all three.
  int states() const { return weights_only_ ? 1 : plan::kStates; }

  // The hyperslab [start, start + count) of one parameter's state (fp32) into dst, row-major in
  // the slab's shape (prod(count) floats). start and count have the parameter's rank (empty for a
  // 0-dim tensor). HDF5: one H5Dread of a hyperslab selection, through a per-dataset handle kept
  // open; pt: a copy out of the memory-mapped .pt file, also kept open. Checks dtype float32 and
  // the manifest's shape the first time a tensor is opened. Throws ucp::Error naming the file, the
  // parameter and the state.
  virtual void ReadSlab(const std::string& param, plan::State state, std::span<const int64_t> start,
                        std::span<const int64_t> count, float* dst) = 0;
  void ReadAll(const std::string& param, plan::State state, float* dst);
  // The step as the .pt store's step.pt holds it (a 0-dim tensor, or a Python int / float);
  // nullptr when the parameter has none.
  virtual pt::ValuePtr ReadStep(const std::string& param) = 0;
  // The keys DeepSpeed's loader reads beside 'param' (for writing .pt files from any store).
  virtual UniversalKeys ReadUniversalKeys(const std::string& param) = 0;
  // XXH64 of the raw little-endian bytes of one state tensor, streamed in slabs of about 16 MiB.
  uint64_t TensorDigest(const std::string& param, plan::State state);
  // A torch.save file of the folder (a model-states file, zero/optimizer_state.pt, a .pt atom), read
  // and checked against the manifest's size and XXH64 of it (the whole file, before any of
  // its bytes is used): a damaged file is refused naming it and `what` (a parameter and state),
  // never passed on. A file the manifest does not list is refused too.
  pt::TorchFile ReadCheckedFile(const std::string& rel, const std::string& what = "") const;
  // Any other file the manifest lists (a carried job file: job/config.json, ...), its bytes checked
  // the same way before they are returned.
  std::string ReadCheckedBytes(const std::string& rel, const std::string& what = "") const;
  // Whether the manifest lists this file (relative to the folder).
  bool Lists(const std::string& rel) const { return records_.count(rel) > 0; }
  // Drops the open handles of a parameter (a reader that moves on frees them).
  virtual void Forget(const std::string& param) = 0;
  // The blocks a state tensor is read in, whole (HDF5: its chunk shape); empty when any slab is
  // read exactly (.pt, or a contiguous dataset). Readers that align their slabs to it read each
  // stored byte once.
  virtual std::vector<int64_t> ReadBlock(const std::string& param, plan::State state) = 0;

  // Tensor bytes read so far (4 x the elements of every slab): "bytes read" of a reshard report.
  uint64_t bytes_read() const { return bytes_read_.load(); }
  // What those reads cost in storage: HDF5 reads whole chunks, so for the hdf5 store this counts
  // every chunk a slab touches in full (an upper bound: HDF5's chunk cache may spare a re-read);
  // for the pt store it equals bytes_read(). bytes_read() / storage_bytes_read() is the efficiency
  // of the chunking for a reader's slabs.
  uint64_t storage_bytes_read() const { return storage_bytes_read_.load(); }

 protected:
  AtomReader(StoreKind store, std::string dir, nlohmann::json manifest);
  // Throws unless [start, start + count) lies inside the parameter's shape.
  void CheckSlab(const AtomParam& p, plan::State state, std::span<const int64_t> start,
                 std::span<const int64_t> count) const;
  std::atomic<uint64_t> bytes_read_{0}, storage_bytes_read_{0};

 private:
  StoreKind store_;
  bool weights_only_ = false;
  std::string dir_;
  nlohmann::json manifest_;
  std::vector<AtomParam> params_;
  std::map<std::string, size_t> index_;
  std::map<std::string, FileRecord> records_;  // the manifest's file list, by relative path
};

// What a writer is told of every parameter before any data: every rank gets the same list (all
// parameters of the checkpoint, in manifest order), whatever it writes itself.
struct AtomSpec {
  std::string name;
  std::vector<int64_t> shape;
  nlohmann::json meta;  // the manifest entry's metadata (ParamMetaJson), without storage
  UniversalKeys keys;
  pt::ValuePtr step;  // written with the fp32 state; nullptr: the parameter has no step
  int split_dim = -1;  // chooses the HDF5 chunk shape
  bool weights_only = false;  // fp32 only: no exp_avg / exp_avg_sq (a model imported without its optimizer)
};
// The states a parameter's store holds: fp32, exp_avg and exp_avg_sq, or fp32 alone (weights only).
inline int StatesOf(const AtomSpec& s) { return s.weights_only ? 1 : plan::kStates; }

// What a commit leaves for the manifest (complete on rank 0 only).
struct StoreCommit {
  std::vector<FileRecord> files;  // files Commit itself wrote (hdf5: atoms.h5)
  nlohmann::json storage;         // parameter name -> the storage part of its manifest entry
};

// Writes the tensors of an atomic checkpoint into one store.
//   pt:   Write commits zero/<param>/<state>.pt (and step.pt with fp32) at once, each atomically;
//         thread-safe. Commit only describes them.
//   hdf5: Create makes <dir>/atoms.h5.tmp-<pid>-<n> with every group and dataset (collective under
//         MPI: every rank passes the same specs); Write is one independent H5Dwrite of a whole
//         dataset by whichever rank holds the tensor; Commit closes the file (collective), rank 0
//         then adds the attributes (metadata, XXH64 of every dataset, steps), fsyncs and renames it
//         to atoms.h5. Write calls are serialized; make them from the thread that started MPI
//         (MPI_THREAD_FUNNELED). A writer destroyed before Commit removes its temporary file.
// Every FileRecord returned by Write or Commit, on any rank, belongs in the manifest.
class AtomWriter {
 public:
  static std::unique_ptr<AtomWriter> Create(StoreKind store, const std::string& dir, std::vector<AtomSpec> specs,
                                            shuffle::Comm& comm);
  virtual ~AtomWriter() = default;
  // One full state tensor (row-major, the spec's shape). Returns the files it committed.
  virtual std::vector<FileRecord> Write(const std::string& param, plan::State state, const float* data) = 0;
  // Whether Write may run on several threads at once (pt: yes; hdf5: no).
  virtual bool concurrent() const = 0;
  // Split tensors (pt only; splits() says): WritePart puts elements [begin, begin + n) of a state
  // tensor (row-major) in place in the one file every part of it shares, under a temporary name
  // (zero/<param>/<state>.pt.tmp-split), and returns the CRC-32 and XXH64 of their bytes;
  // thread-safe, any rank. Once every part is written, FinishParts (one rank) completes the file,
  // given the CRC-32 of the whole tensor (the parts' combined in order) and each part's (begin, n,
  // XXH64) in order, renames it into place and returns what Write would have: the same bytes as Write
  // of the whole tensor, recorded by parts (FileRecord::parts: no rank reads the file back).
  struct PartDigest {
    uint32_t crc32 = 0;
    uint64_t xxh64 = 0;
  };
  struct WrittenPart {
    int64_t begin = 0, n = 0;
    uint64_t xxh64 = 0;
  };
  virtual bool splits() const { return false; }
  virtual PartDigest WritePart(const std::string& param, plan::State state, int64_t begin, int64_t n, const float* data);
  virtual std::vector<FileRecord> FinishParts(const std::string& param, plan::State state, uint32_t crc,
                                              const std::vector<WrittenPart>& parts);
  // Collective: after every rank's last Write.
  virtual StoreCommit Commit() = 0;
  const std::vector<AtomSpec>& specs() const { return specs_; }

 protected:
  AtomWriter(std::string dir, std::vector<AtomSpec> specs);
  const AtomSpec& spec(const std::string& name) const;  // throws naming the parameter
  std::string dir_;
  std::vector<AtomSpec> specs_;
  std::map<std::string, size_t> index_;
};

// The chunk shape of a tensor in atoms.h5: about 1 MiB; along a split dimension > 0 an eighth,
// quarter or half of it where that divides; along dimension 0 whole rows, as many as divide the
// unit slice boundaries fall on (TP eighths of the dimension, per sub-parameter for Shard-NC),
// so that a TP slice is a run of whole chunks. Empty for an empty or 0-dim tensor (contiguous).
std::vector<int64_t> ChunkShape(const std::vector<int64_t>& shape, int split_dim,
                                const std::vector<int64_t>& sub_param_sizes = {});

// The two stores' implementations (atom_store_pt.cpp, atom_store_h5.cpp).
std::unique_ptr<AtomReader> OpenPtReader(const std::string& dir, nlohmann::json manifest);
std::unique_ptr<AtomReader> OpenH5Reader(const std::string& dir, nlohmann::json manifest);
// A run's scratch whose fp32 weights stay in the training checkpoint's partitions (atom_store_partitions.cpp).
std::unique_ptr<AtomReader> OpenPartitionsReader(const std::string& dir, nlohmann::json manifest);
std::unique_ptr<AtomWriter> CreatePtWriter(const std::string& dir, std::vector<AtomSpec> specs, shuffle::Comm& comm);
std::unique_ptr<AtomWriter> CreateH5Writer(const std::string& dir, std::vector<AtomSpec> specs, shuffle::Comm& comm);

// An atomic checkpoint folder in the commit protocol (core/commit.h): its one marker, the manifest,
// and what --force clears under it: the tensors of either store and the resume journal.
std::vector<std::string> AtomicFolderMarkers();
std::vector<std::string> AtomicFolderContents();

// The XXH64 (hex) atoms.h5 records for a dataset (its attribute "xxh64"); hdf5 readers only.
std::string RecordedDatasetDigest(AtomReader& reader, const std::string& param, plan::State state);

// XXH64 of the raw little-endian bytes of a float32 tensor of `shape`, streamed through `read` in
// slabs of whole rows of about 4 MiB (a reader's TensorDigest, and the HDF5 reader's check of a
// dataset against the manifest when it first opens it).
uint64_t DigestBySlabs(const std::vector<int64_t>& shape,
                       const std::function<void(std::span<const int64_t>, std::span<const int64_t>, float*)>& read);

// Row-major copy of the slab [start, start + count) of a float32 tensor of `shape` whose bytes are at src
// (of any alignment: a tensor record inside a mapped file) into dst.
// ContiguousSlabStart: the element offset of the slab's first element when the slab is one run of
// the tensor's elements (whole inner dimensions, a single index in the outer ones), else nothing.
std::optional<int64_t> ContiguousSlabStart(std::span<const int64_t> shape, std::span<const int64_t> start,
                                           std::span<const int64_t> count);
void CopySlab(const uint8_t* src, std::span<const int64_t> shape, std::span<const int64_t> start,
              std::span<const int64_t> count, float* dst);

}  // namespace ucp::store
