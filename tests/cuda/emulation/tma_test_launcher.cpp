// The TMA / mbarrier test kernels (tma_test_kernels.cuh) on the CPU emulation:
// one block of std::threads per case; mbarriers, TMA loads and tensor maps
// from mbarrier_emulation.h and tma_emulation.h, wgmma from wgmma_emulation.h.
#include <string>

#include "tests/cuda/tma_test_kernels.cuh"

namespace gaugewatch::testing_cuda::tma_test {
namespace {

struct EmulatedLauncher {
  template <class... Params, class... Args>
  static std::string run(void (*kernel)(Params...), int threads, size_t smem_bytes, Args... args) {
    gaugewatch_emulation::run_grid(dim3(1), threads, smem_bytes, [&] { kernel(args...); });
    return "";
  }
};

}  // namespace

std::string encode_check(const Tensor& t, int box_rows, int box_cols) {
  return gpu::tma_test::encode_check(t, box_rows, box_cols);
}

std::string run_phases(const Tensor& in, uint32_t* out) {
  return gpu::tma_test::run_phases<EmulatedLauncher>(in, out);
}

std::string run_ring(const Tensor& in, int origin_row, int origin_col, int tiles_r, int tiles_c, uint16_t* out) {
  return gpu::tma_test::run_ring<EmulatedLauncher>(in, origin_row, origin_col, tiles_r, tiles_c, out);
}

std::string run_wgmma(Load load, const Tensor& a, const Tensor& b, const Tensor& v, float* s, float* c) {
  return gpu::tma_test::run_wgmma<EmulatedLauncher>(load, a, b, v, s, c);
}

std::string encode_f32_check(const F32Tensor& t, int box_rows) { return gpu::tma_test::encode_f32_check(t, box_rows); }

std::string run_reduce(const float* tile, const F32Tensor& dst, int row, int plane, int times) {
  return gpu::tma_test::run_reduce<EmulatedLauncher>(tile, dst, row, plane, times);
}

}  // namespace gaugewatch::testing_cuda::tma_test
