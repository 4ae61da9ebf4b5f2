// The fragments of a DeepSpeed index as a whole, once every optimizer file is read: placed in their
// parameters where no list gives the flat order (PlaceByFragments), and checked to cover every
// element of every parameter exactly once (CheckCoverage).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "formats/deepspeed/params.h"

namespace ucp::deepspeed {

// Where nothing lists each group's parameters in flat order (no param_shapes: Mixture of Experts,
// DeepSpeed 0.19's BF16 optimizer at ZeRO-0), the fragments say it, each placed at its flat position
// in its group's buffer: after every optimizer file, each fragment is made relative to its
// parameter's first element (the smallest flat position the parameter has in the buffers of its
// (pp, tp)), each parameter gets its group, and the groups' parameter lists for the coverage check
// follow the flat order.
void PlaceByFragments(source::SourceIndex& L, GroupParams& group_params);

// Two checks on the fragments. In each file's flat group buffer no two fragments may share an
// element (an overlap: a corrupt mapping or a foreign file). And every element of every
// parameter's TP-local tensor at every (pp, tp) that holds it must be in exactly one fragment (a
// gap is a missing fragment: the message names the rank file that should hold it). `partitions`:
// (pp, tp, group) -> the flat partition size of ZeRO-1/2.
void CheckCoverage(source::SourceIndex& L, GroupParams& group_params,
                   const std::map<std::tuple<int, int, int>, int64_t>& partitions);

}  // namespace ucp::deepspeed
