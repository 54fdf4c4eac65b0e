// One instantiation of the fused BF16 backward: head dim 64, projection gproj.
#include "kernels/cuda/bf16_backward_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template cudaError_t launch<64, Projection::kGproj>(const Args&, Bf16KernelPair, cudaStream_t);
}  // namespace gaugewatch::gpu::bf16
