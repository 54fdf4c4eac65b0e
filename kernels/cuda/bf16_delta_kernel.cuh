#pragma once
// The delta pre-pass of the fused BF16 backward. Included by exactly one
// translation unit of each build (bf16_backward_delta.cu on the GPU,
// tests/cuda/emulation/bf16_launcher.cpp on the CPU emulation): a __global__
// function defined in a header shared by several .cu files would be defined
// once per file.

#include "kernels/cuda/bf16_backward_common.cuh"

namespace gaugewatch::gpu::bf16 {

// delta_i = sum_c dO_ic O_ic in FP32 from the BF16 operands: one warp per row,
// lane-strided partial sums and a fixed shuffle tree (bitwise repeatable).
__global__ void __launch_bounds__(256) delta_kernel(const DeltaArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const bool live = row < a.rows;  // every lane stays for the shuffles
  float sum = 0.0f;
  if (live) {
    const int64_t bh = row / a.n, i = row % a.n;
    const int64_t b = bh / a.hq, h = bh % a.hq;
    const uint16_t* go = head_ptr(a.grad_out, a.grad_out_strides, b, h) + i * a.grad_out_strides.row;
    const uint16_t* o = head_ptr(a.out, a.out_strides, b, h) + i * a.out_strides.row;
    for (int col = lane; col < a.d; col += 32) {
      sum += mma::bf16_bits_to_float(go[col]) * mma::bf16_bits_to_float(o[col]);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (live && lane == 0) a.delta[row] = sum;
}

}  // namespace gaugewatch::gpu::bf16
