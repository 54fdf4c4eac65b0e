// The wgmma test kernels (wgmma_test_kernels.cuh) on the CPU emulation: one
// block of 128 std::threads per case, the wgmma primitives from
// wgmma_emulation.h.
#include "tests/cuda/wgmma_test_kernels.cuh"

namespace gaugewatch::testing_cuda::wgmma_test {
namespace {

struct EmulatedLauncher {
  template <class... Params, class... Args>
  static cudaError_t run(void (*kernel)(Params...), size_t smem_bytes, Args... args) {
    gaugewatch_emulation::run_grid(dim3(1), gpu::wgmma::kWarpgroupThreads, smem_bytes, [&] { kernel(args...); });
    return cudaSuccess;
  }
};

}  // namespace

cudaError_t run(Case which, int size, const Operands& operands) {
  return gpu::wgmma_test::run_case<EmulatedLauncher>(which, size, operands);
}

}  // namespace gaugewatch::testing_cuda::wgmma_test
