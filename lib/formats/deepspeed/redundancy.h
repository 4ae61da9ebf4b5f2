// What a DeepSpeed checkpoint stores twice, found while it is indexed. Files of one tag that come
// from different saves, ranks or runs (swapped, mixed in, re-saved) pass every CRC-32; only copies
// that disagree show them. Here, the metadata every file repeats, compared at once; and where the
// module keeps each weight besides its fp32 master, recorded for map/weight_copies.h to compare.
#pragma once

#include <functional>
#include <memory>

#include "pt/torch_file.h"
#include "source/source_index.h"

namespace ucp::deepspeed {

using ParseFile = std::function<std::shared_ptr<pt::TorchFile>(const source::ShardFile&)>;

// The writer's version (ds_version) in every file, the step, world sizes and iteration in every
// model-states file, and each optimizer group's step in every optimizer file must agree: a file
// whose value differs from the others' is one error naming it (the fewest files holding a value are
// the odd ones), put first in L.problems (what else is wrong may follow from it).
void CheckFilesAgree(source::SourceIndex& L, const ParseFile& parse);

// Records in L.weight_copies each weight the module keeps of a parameter the optimizer files hold:
// a plain model's module in its model-states file, a pipeline's layer files ("<spec>.<key>", the tied
// embedding "tied_modules.embed.<key>" in spec 1's file). Only ZeRO-0/1/2 and the BF16 optimizer keep
// both (ZeRO-3's module holds empty placeholders; without ZeRO, a torch optimizer has no masters).
void RecordWeightCopies(source::SourceIndex& L, const ParseFile& parse);

// ZeRO-3 keeps the masters only, but a Hugging Face Trainer folder saved with
// stage3_gather_16bit_weights_on_model_save holds model.safetensors (or its shards) beside the tag: every
// weight gathered, in the model's dtype. Records those tensors in L.weight_copies (the files in
// L.copy_files) for map/weight_copies.h to compare; says in a note what was compared, or that no second
// copy exists. After the job files are found (L.job).
void RecordGatheredWeights(source::SourceIndex& L);

}  // namespace ucp::deepspeed
