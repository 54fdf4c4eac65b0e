#pragma once
// The delta pre-pass of the fused BF16 backward. Included by exactly one
// translation unit of each build (bf16_backward_delta.cu on the GPU,
// tests/cuda/emulation/bf16_launcher.cpp on the CPU emulation): a __global__
// function defined in a header shared by several .cu files would be defined
// once per file.

#include "kernels/cuda/bf16_backward_common.cuh"

namespace gaugewatch::gpu::bf16 {

// delta_i = sum_c dO_ic O_ic in FP32 from the BF16 operands. Memory-bound
// (2 d bytes of dO and of O per row, one FP32 out): each row is read by
// kLanesPerRow = min(32, d / 8) lanes with one 16-byte load of each operand
// per lane and step (rows are 16-byte aligned: strides are multiples of 8
// elements, bf16_backward.cu checks), so a warp covers 32 / kLanesPerRow rows
// (4 at d = 64, 2 at d = 128) in full 128-byte lines. Per lane: the products
// of its 8-element chunks in column order (chunks lane, lane + kLanesPerRow,
// ...) accumulated by FMA (the same rounding on the GPU and the CPU
// emulation), then a fixed xor-shuffle tree over the row's lanes: the
// summation order depends on d only, so the result is bitwise repeatable.
inline constexpr int kDeltaWarps = 8;  // 256 threads per block

template <int kLanesPerRow>
__device__ __forceinline__ void delta_rows(const DeltaArgs& a) {
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  const int lane = threadIdx.x & 31;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kDeltaWarps + (threadIdx.x >> 5)) * kRowsPerWarp +
                      lane / kLanesPerRow;
  const int part = lane % kLanesPerRow;
  const bool live = row < a.rows;  // every lane stays for the shuffles
  float sum = 0.0f;
  if (live) {
    const int64_t bh = row / a.n, i = row % a.n;
    const int64_t b = bh / a.hq, h = bh % a.hq;
    const uint16_t* go = head_ptr(a.grad_out, a.grad_out_strides, b, h) + i * a.grad_out_strides.row;
    const uint16_t* o = head_ptr(a.out, a.out_strides, b, h) + i * a.out_strides.row;
    for (int col = 8 * part; col < a.d; col += 8 * kLanesPerRow) {
      const uint4 gv = *reinterpret_cast<const uint4*>(go + col);
      const uint4 ov = *reinterpret_cast<const uint4*>(o + col);
      const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w};
      const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sum = fmaf(mma::bf16_bits_to_float(static_cast<uint16_t>(gw[e] & 0xffffu)),
                   mma::bf16_bits_to_float(static_cast<uint16_t>(ow[e] & 0xffffu)), sum);
        sum = fmaf(mma::bf16_bits_to_float(static_cast<uint16_t>(gw[e] >> 16)),
                   mma::bf16_bits_to_float(static_cast<uint16_t>(ow[e] >> 16)), sum);
      }
    }
  }
#pragma unroll
  for (int off = kLanesPerRow / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (live && part == 0) a.delta[row] = sum;
}

// d a multiple of 8 (the fused backward: 64 or 128).
__global__ void __launch_bounds__(32 * kDeltaWarps) delta_kernel(const DeltaArgs a) {
  if (a.d <= 64) {
    delta_rows<8>(a);
  } else if (a.d <= 128) {
    delta_rows<16>(a);
  } else {
    delta_rows<32>(a);
  }
}

// Rows per block of delta_kernel for head dim d.
inline int64_t delta_rows_per_block(int d) { return kDeltaWarps * (d <= 64 ? 4 : d <= 128 ? 2 : 1); }

}  // namespace gaugewatch::gpu::bf16
