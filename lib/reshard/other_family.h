// ucp-reshard ATOMIC -o OUT to a DeepSpeed layout, ATOMIC of another family (Megatron-Core's, from a
// torch_dist or legacy save; torchtitan's DCP): converted first into OUT/.ucp-scratch-atomic under
// Megatron-DeepSpeed's GPTModel names with its Adam moments and step (convert::ConvertOptions::as_deepspeed),
// then resharded from there as any DeepSpeed source is, the scratch removed whatever the outcome (with
// OUT itself where the run created it and it is left empty): -o writes only under OUT.
#pragma once

#include <ostream>

#include "reshard/reshard.h"
#include "shuffle/comm.h"

namespace ucp::reshard {

// Whether `o` asks a DeepSpeed layout of an atomic checkpoint of another family (read from its
// manifest; false for a folder that is none, which RunReshard then refuses as it is).
bool NeedsDeepSpeedNames(const ReshardOptions& o);

// Collective. Exit codes as RunReshard's.
int ReshardThroughDeepSpeedNames(const ReshardOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

}  // namespace ucp::reshard
