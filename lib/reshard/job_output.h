// A training framework's files beside the new layout's tag (source/job_files.h): what a reshard of
// a Hugging Face Trainer checkpoint writes besides DeepSpeed's files, so that the folder is again
// a checkpoint-N that Trainer resumes from (Trainer.train(resume_from_checkpoint=...)) on the new
// number of processes. Its files as they were (trainer_state.json, scheduler.pt, training_args.bin,
// config.json, ...: the job's state does not depend on the layout), and one RNG file per process of
// the new job (source::RngFilesFor: its own where the rank existed, else rank r mod the old world's).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "layout/reshard_plan.h"
#include "layout/target.h"
#include "source/job_files.h"

namespace ucp::reshard {

struct JobOutput {
  std::vector<std::pair<std::string, std::string>> files;  // (name in the output root, carried file job/<name>)
  std::vector<std::string> notes;  // what the run says about them (rank 0 prints)
  std::vector<std::string> names() const;  // the output names, for the claim
};

// The files to write into `root` for target `T`. -o (`in_place` false): every carried file, the RNG
// files by the rule. In place, the root already holds the job's files: only the new processes' RNG
// files it lacks (an existing file is never replaced). Empty for a source without job files.
JobOutput PlanJobOutput(const Source& S, const TargetLayout& T, const std::string& root, bool in_place);

// Writes them, each checked against the manifest as it is read and written atomically, without an
// fsync (the run's one sync makes them durable before `latest`).
void WriteJobOutput(const Source& S, const JobOutput& J, const std::string& root);

// A Trainer checkpoint written (-o, not in place) under the name checkpoint-M for its step N: refused
// (ucp::Error) naming Trainer's name for it, which ucp-inspect and ucp-convert require after.
void RefuseMisnamedCheckpoint(const source::JobFiles& job, const std::string& root, bool in_place);

// For a job whose world changes: what its global batch becomes, from the ds_config the checkpoint
// keeps (train_micro_batch_size_per_gpu x gradient_accumulation_steps x processes) and how to keep
// it; empty where the checkpoint does not say or nothing changes.
std::string GlobalBatchNote(const Source& S, int from_world, int to_world);

}  // namespace ucp::reshard
