#pragma once
// The gaugewatch op library registers itself once per process. Each backend
// file contributes its kernels through one of these functions; registration.cpp
// calls them from a single static registrar that first checks whether another
// copy of this library (loaded from another path) already defined the ops, and
// then stays inert instead of aborting the process on a duplicate definition.

#include <torch/library.h>

namespace gaugewatch::torch_ops {

void register_cpu_kernels(torch::Library& m);
void register_meta_kernels(torch::Library& m);
#ifdef GAUGEWATCH_OPS_CUDA
void register_cuda_kernels(torch::Library& m);
// ops_cuda_metrics.cpp; called from register_cuda_kernels.
void register_cuda_metrics(torch::Library& m);
#endif

}  // namespace gaugewatch::torch_ops
