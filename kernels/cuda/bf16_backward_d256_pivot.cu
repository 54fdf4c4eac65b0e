// One instantiation of the fused BF16 backward: head dim 256, projection pivot
// (the mma.sync pair, bf16_backward_launch.cuh).
#include "kernels/cuda/bf16_backward_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template cudaError_t launch<256, Projection::kPivot>(const Args&, Bf16KernelPair, cudaStream_t);
}  // namespace gaugewatch::gpu::bf16
