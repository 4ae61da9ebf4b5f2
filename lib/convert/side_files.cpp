// The side files DeepSpeed's universal loader reads besides the atomic tensors, written by the
// writer threads alongside the tensors, before the store's commit makes the output durable (the .pt
// store's commit syncs the file system; the HDF5 store's syncs only atoms.h5): the model-states
// files copied by the ranks the plan gave them, zero/optimizer_state.pt (and the args file a source
// without one to carry gets) by the last rank (rank 0 has the commit to do), and the training framework's files beside the tag. Their records reach
// rank 0 with the others.
#include <filesystem>

#include "convert/steps.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "pt/torch_file.h"
#include "store/universal_folder.h"

namespace ucp::convert {

namespace {

// zero/optimizer_state.pt, which DeepSpeed's universal loader reads besides the atomic tensors:
// from the optimizer file at pp=0, tp=0, dp=0.
store::FileRecord WriteOptimizerStateFile(const source::SourceIndex& L, const std::string& out, Durability durability) {
  if (L.optimizer_state) {
    auto d = pt::WriteTorchFile(out + "/zero/optimizer_state.pt", *L.optimizer_state, durability);
    return {"zero/optimizer_state.pt", d.size, d.xxh64};
  }
  const source::ShardFile* first_optim = nullptr;
  for (const auto& f : L.files)
    if (f.data && f.pp == 0 && f.tp == 0 && f.dp == 0) first_optim = &f;
  if (!first_optim) throw Error(L.dir + ": no optimizer file at (pp=0, tp=0, dp=0)");
  auto root = pt::ReadTorchFile(L.dir + "/" + first_optim->name);
  auto osv = WithContext(L.dir + "/" + first_optim->name, [&] { return store::OptimizerStateValue(*root.root, L.zero_stage); });
  // A Mixture-of-Experts model-states file has no ds_config; ucp-reshard writes the optimizer
  // files' from this copy (DeepSpeed's universal load reads only the keys it knows).
  if (auto config = root.root->Get("ds_config"); L.moe && config) pt::SetItem(*osv, "ds_config", config);
  // A torch optimizer's state (no ZeRO) records no ds_version, which DeepSpeed's ZeRO optimizers
  // require of the state a universal load restores: the checkpoint's own.
  if (L.optimizer == "torch" && !L.ds_version.empty()) pt::SetItem(*osv, "ds_version", pt::Value::Str(L.ds_version));
  auto d = pt::WriteTorchFile(out + "/zero/optimizer_state.pt", *osv, durability);
  return {"zero/optimizer_state.pt", d.size, d.xxh64};
}

// A side file's writing as a writer's task: timed, then recorded.
template <typename Make>
std::function<void()> SideFile(RankOutput& out, Make make) {
  return [&out, make] {
    const auto start = Clock::now();
    store::FileRecord r = make();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    out.c.write_ns += ns, out.c.side_ns += ns;
    out.Record({r});
  };
}

}  // namespace

void SubmitSideFiles(const ConvertOptions& o, const Planned& x, int rank, int ranks, TaskPool& writers, RankOutput& out) {
  const auto& L = x.L;
  // Captured by value: the writers run these after this returns.
  const Durability durability = x.kind == store::StoreKind::Pt ? Durability::Batch : Durability::Now;
  if (rank == ranks - 1) {
    if (!o.weights_only)
      writers.Submit(0, SideFile(out, [&, durability] { return WriteOptimizerStateFile(L, o.output, durability); }));
    if (L.args_state)  // the source's args, written here (no file of the source carries them alone)
      writers.Submit(0, SideFile(out, [&, durability] {
        auto d = pt::WriteTorchFile(o.output + "/" + L.args_file, *L.args_state, durability);
        return store::FileRecord{L.args_file, d.size, d.xxh64};
      }));
    // The framework's files beside the tag (Trainer's), as they are: job/<name>.
    if (!L.job.carried.empty()) std::filesystem::create_directories(o.output + "/" + source::kJobFolder);
    for (const std::string& name : L.job.carried)
      writers.Submit(0, SideFile(out, [&, durability, name] {
        const std::string& root = L.job.root.empty() ? L.root : L.job.root;
        return store::CopyFileAtomically(root + "/" + name, o.output, std::string(source::kJobFolder) + "/" + name, durability);
      }));
  }
  for (size_t f = 0; f < L.files.size(); ++f)
    if (x.plan.file_carrier[f] == rank)
      writers.Submit(0, SideFile(out, [&, durability, f] {
        // Checked against its zip records' CRC-32s as it is copied: DeepSpeed loads it as it is.
        const auto& file = L.files[f];
        if (file.checksummed.empty()) throw Error(L.dir + "/" + file.name + " lists no checksummed record: its bytes cannot be checked");
        return store::CopyFileAtomically(L.dir + "/" + file.name, o.output, file.name, durability, file.checksummed);
      }));
}

}  // namespace ucp::convert
