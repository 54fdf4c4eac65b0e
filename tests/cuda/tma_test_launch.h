#pragma once
// The launcher of the TMA and mbarrier primitive tests (tma_test.cpp), one
// definition per build: tma_test_gpu.cu (<<<>>> on an sm_90a GPU, tensor maps
// from the driver) and emulation/tma_test_launcher.cpp (the CPU emulation).
// Kernels in tma_test_kernels.cuh; every pointer is device memory. Each call
// returns "" or what failed (tensor map encoding, launch, execution).

#include <cstdint>
#include <string>

namespace gaugewatch::testing_cuda::tma_test {

// A row-major (rows, cols) BF16 tensor with a row stride (elements).
struct Tensor {
  const uint16_t* data = nullptr;
  int rows = 0, cols = 0, row_stride = 0;
};

// encode_bf16_tile_map's verdict on a tensor and a box_rows x box_cols box
// ("" = encoded). Invalid arguments are refused before any driver call, so
// this runs without a GPU.
std::string encode_check(const Tensor& t, int box_rows, int box_cols);

// Single-thread trace of one barrier (count 2): the try_wait results after
// each step, in the order of tma_test_kernels.cuh's phase_kernel; out holds
// kPhaseSteps values (1 = complete). `in` supplies the one 64 x 64 box.
inline constexpr int kPhaseSteps = 8;
std::string run_phases(const Tensor& in, uint32_t* out);

// Producer-consumer ring: tile t = (i, j), i < tiles_r, j < tiles_c, row-major
// in t, is the 64 x 64 box at (origin_row + 64 i, origin_col + 64 j), loaded
// by TMA into a 2-stage ring and copied by the consumer warpgroups from the
// swizzled tile to out[t][64][64] (dense, out-of-bounds elements as loaded).
std::string run_ring(const Tensor& in, int origin_row, int origin_col, int tiles_r, int tiles_c, uint16_t* out);

// S = A B^T (A, B [64][128], K-major, two sub-tiles each) and C = A0^T V (A0
// = A's first 64 columns as a [64 = k][64 = m] MN-major operand, V [64][64]
// MN-major), wgmma ss; operands loaded by TMA or by cp.async (the backward's
// current path). s and c: row-major [64][64] FP32.
enum class Load { kTma, kCpAsync };
std::string run_wgmma(Load load, const Tensor& a, const Tensor& b, const Tensor& v, float* s, float* c);

// A dense row-major (planes, rows, cols) FP32 tensor.
struct F32Tensor {
  float* data = nullptr;
  int planes = 0, rows = 0, cols = 0;
};

// encode_f32_reduce_map's verdict on a tensor and a box of box_rows x 32
// floats ("" = encoded), before any driver call.
std::string encode_f32_check(const F32Tensor& t, int box_rows);

// dst[plane][row + r][c] += tile[r][c] for the rows inside dst, c < 64: a
// warpgroup stores the dense [64][64] FP32 `tile` into shared memory in
// tma::f32_tile_offset's swizzled layout, then one thread adds it by
// tma::reduce_rows_tile (two 64 x 32 tensor reductions), `times` times.
std::string run_reduce(const float* tile, const F32Tensor& dst, int row, int plane, int times);

}  // namespace gaugewatch::testing_cuda::tma_test
