// One instantiation of the fused BF16 backward: head dim 128, projection pivot.
#include "kernels/cuda/bf16_backward_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template cudaError_t launch<128, Projection::kPivot>(const Args&, Bf16KernelPair, cudaStream_t);
}  // namespace gaugewatch::gpu::bf16
