// The wgmma test kernels (wgmma_test_kernels.cuh) launched on the GPU: built
// for the project's CUDA architecture (sm_90a), so the wgmma instructions of
// kernels/cuda/wgmma.cuh are the ones that run.
#include "tests/cuda/wgmma_test_kernels.cuh"

namespace gaugewatch::testing_cuda::wgmma_test {
namespace {

struct DeviceLauncher {
  template <class... Params, class... Args>
  static cudaError_t run(void (*kernel)(Params...), size_t smem_bytes, Args... args) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
    kernel<<<1, gpu::wgmma::kWarpgroupThreads, smem_bytes>>>(args...);
    err = cudaGetLastError();
    // Synchronous, so an illegal instruction or address is reported by this case.
    return err != cudaSuccess ? err : cudaDeviceSynchronize();
  }
};

}  // namespace

cudaError_t run(Case which, int size, const Operands& operands) {
  return gpu::wgmma_test::run_case<DeviceLauncher>(which, size, operands);
}

}  // namespace gaugewatch::testing_cuda::wgmma_test
