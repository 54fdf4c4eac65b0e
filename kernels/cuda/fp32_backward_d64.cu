// Head dim 64 instantiation of the fused FP32 attention backward
// (kernels/cuda/fp32_backward.h states the math and layouts; the kernels are in
// fp32_backward_kernel.cuh). Built into gaugewatch_cuda for sm_90a; exercised
// by tests/cuda/fp32_backward_test.cu.

#include "kernels/cuda/fp32_backward_launch.cuh"

namespace gaugewatch::gpu::detail {

template cudaError_t launch_fp32_backward<64>(const Args& args, cudaStream_t stream);
template cudaError_t launch_mean_key<64>(const float* k, float* mu, int64_t heads, int64_t m,
                                        cudaStream_t stream);

}  // namespace gaugewatch::gpu::detail
