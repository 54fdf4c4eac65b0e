// The TMA / mbarrier test kernels (tma_test_kernels.cuh) launched on the GPU:
// built for the project's CUDA architecture (sm_90a), tensor maps encoded by
// the driver (cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion).
#include <string>

#include "tests/cuda/tma_test_kernels.cuh"

namespace gaugewatch::testing_cuda::tma_test {
namespace {

std::string failure(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err);
}

struct DeviceLauncher {
  template <class... Params, class... Args>
  static std::string run(void (*kernel)(Params...), int threads, size_t smem_bytes, Args... args) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return failure("cudaFuncSetAttribute", err);
    kernel<<<1, threads, smem_bytes>>>(args...);
    err = cudaGetLastError();
    if (err != cudaSuccess) return failure("launch", err);
    // Synchronous, so an illegal instruction, address or a hang shows in this case.
    err = cudaDeviceSynchronize();
    return err != cudaSuccess ? failure("kernel", err) : "";
  }
};

}  // namespace

std::string encode_check(const Tensor& t, int box_rows, int box_cols) {
  return gpu::tma_test::encode_check(t, box_rows, box_cols);
}

std::string run_phases(const Tensor& in, uint32_t* out) { return gpu::tma_test::run_phases<DeviceLauncher>(in, out); }

std::string run_ring(const Tensor& in, int origin_row, int origin_col, int tiles_r, int tiles_c, uint16_t* out) {
  return gpu::tma_test::run_ring<DeviceLauncher>(in, origin_row, origin_col, tiles_r, tiles_c, out);
}

std::string run_wgmma(Load load, const Tensor& a, const Tensor& b, const Tensor& v, float* s, float* c) {
  return gpu::tma_test::run_wgmma<DeviceLauncher>(load, a, b, v, s, c);
}

std::string encode_f32_check(const F32Tensor& t, int box_rows) { return gpu::tma_test::encode_f32_check(t, box_rows); }

std::string run_reduce(const float* tile, const F32Tensor& dst, int row, int plane, int times) {
  return gpu::tma_test::run_reduce<DeviceLauncher>(tile, dst, row, plane, times);
}

}  // namespace gaugewatch::testing_cuda::tma_test
