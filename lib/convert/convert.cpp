// RunConvert: the conversion as its steps (steps.h), each in the file of its idea. Every step ends
// at an agreement of the ranks: one failing rank stops them all, and the lowest failing one says why.
#include "convert/convert.h"

#include "convert/steps.h"
#include "formats/registry.h"
#include "shuffle/agree.h"

namespace ucp::convert {
using shuffle::AnyFailed;
using shuffle::Capture;

int RunConvert(const ConvertOptions& given, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  // A Megatron-LM torch_dist root: the iteration its tracker names, as Megatron-LM's --load reads it.
  ConvertOptions o = given;
  if (std::string iteration = o.source.empty() ? "" : formats::TrackedIteration(o.source); !iteration.empty()) {
    if (comm.rank() == 0 && !o.quiet)
      err << "ucp-convert: note: " << o.source << " is a Megatron-LM checkpoint root: reading " << iteration
          << ", the iteration its latest_checkpointed_iteration.txt names\n";
    o.source = iteration;
  }
  // A model of whole tensors (Hugging Face's; a training format's weights-only save; another family's
  // atomic checkpoint under Megatron-DeepSpeed's names) has no partitions to map: its own run.
  if (o.as_deepspeed) return RunConvertFromModel(o, formats::AtomicAsDeepSpeedSource(), comm, out, err);
  if (const formats::SourceDriver* d = formats::ProbeSource(o.source); d && d->read_param && (!d->weights_only || d->weights_only(o.source)))
    return RunConvertFromModel(o, *d, comm, out, err);
  const int rank = comm.rank();
  const bool talk = rank == 0 && !o.quiet;
  Phases phases;

  // 1. Index, patterns, plan; then what the checkpoint stores twice, compared.
  Planned x;
  std::string error = Capture([&] { x = IndexAndPlan(o, comm.size()); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  phases.Done("index_and_plan");
  if (talk) SayPlanned(o, x, comm.name(), err);
  if (o.plan_only) {
    if (rank == 0) out << (o.json ? WithNotes(x.plan.ToJson(x.L), x).dump(1) + "\n" : x.plan.ToText());
    return 0;
  }
#ifndef UCP_BENCH_NO_WEIGHT_COPY_CHECK
  error = Capture([&] { x.verified = RequireWeightCopiesAgree(o, x.L, comm); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
#else
  if (talk) err << "ucp-convert: warning: built with UCP_BENCH_NO_WEIGHT_COPY_CHECK (a benchmark's baseline): the weights "
                   "the checkpoint stores twice are not compared\n";
#endif
  phases.Done("weight_copies");
  if (o.reference && o.weights_only && ReadsAsIs(x)) return RunReference(o, x, comm, err);

  // 2. The output folder (rank 0), then the resume decision (every rank, from the journal).
  OutputClaim claim;
  if (auto status = ClaimOutput(o, x, comm, err, claim)) return *status;
  phases.Done("prepare");

  // 3. Map, shuffle, union, write: in rounds of bounded size.
  RankOutput mine;
  if (!MapShuffleWrite(o, x, comm, err, mine)) {
    if (talk && !o.removed_on_failure)  // what stays: no manifest, so nothing that looks complete, and the journal of what was done
      err << "ucp-convert: " << o.output << " holds this unfinished run (its journal, no ucp_manifest.json): --resume "
          << "finishes it where the source is as it was (a full disk, a lost rank); a source file replaced or repaired "
          << "is another source: --force converts it afresh; or remove the folder\n";
    return 1;
  }
  phases.Done("shuffle_union_write");

  // 4. Commit (rank 0): optimizer state, model-states files, manifest last, then latest_universal.
  const auto gathered = GatherRecords(comm, mine.records);
  const auto stats = comm.GatherToRoot(RankStats(rank, mine).dump());
  Committed committed;
  error = rank == 0 ? Capture([&] { committed = CommitManifest(o, x, claim, mine, gathered); }) : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  if (talk) SayLatestMoved(o.output, committed, err);
  phases.Done("commit");
  phases.Total();

  // 5. The report.
  return rank == 0 ? Report(o, x, comm.size(), phases, stats, claim, err) : 0;
}

}  // namespace ucp::convert
