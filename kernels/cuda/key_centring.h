#pragma once
// Key centring on the GPU (sm_90): the operands of backend "center", for any
// stock backward (docs/numerics.md, Key centring). Plain C++ API over raw
// device pointers, so the tests and the torch op call the same launcher.
//
// Math, per batch element b and key/value head hk (alpha = scale):
//   m_c  = (1/M) sum_j k_jc,   s_c = sqrt((1/M) sum_j (k_jc - m_c)^2)   (FP64)
//   kbar_c = round(float(m_c)) on k's grid where the policy centres c, else 0:
//            always; auto: |m_c| > offset_spread_ratio * s_c; never: no c
//   k_centred_jc = round(k_jc - kbar_c)   (the difference is exact in FP32;
//                  the one rounding, to k's grid, is exact where the offset
//                  dominates)
//   lse_shifted_i = lse_i - float(alpha) * float(q_i . kbar)   (dot in FP64:
//                  every product q_c kbar_c is exact, and for BF16 and FP16
//                  so is the sum unless the products' magnitudes span more
//                  than ~2^29, so the order of the additions does not change
//                  it; 16-byte chunks of coordinates whose kbar is all 0 are
//                  skipped, so q is read only where some coordinate is
//                  centred), for rows i < N whose lse is finite;
//                  every other entry of the (B, Hq, L) lse, L >= N, is copied
//                  unchanged, and entries L .. L_out - 1 (a padded output) are 0.
// The softmax is unchanged, so a stock backward on (q, k_centred, v, out,
// lse_shifted) returns the same gradients mathematically.
//
// Two launches on one stream, no workspace. Kernel 1 (sums): a cluster of
// 1, 2, 4 or 8 blocks of 512 threads per (b, hk), each block reading its
// share of the keys once from memory and summing the columns of k and of
// (k - k_0)^2 in FP64 (k_0 the head's first key, so the squares do not
// cancel when the offset dominates); the cluster adds the blocks' sums in
// rank order through distributed shared memory and its first block writes
// kbar. Kernel 2 (apply): blocks of 256 threads, several per (b, hk), read
// kbar back and stream the keys again, writing them centred, then shift
// their share of the group's lse rows, several threads per row sharing
// q . kbar. The order of every FP64 sum is a function of the shape only
// (key_centring_args.cuh), so results are bit-identical run to run.
// Structure and cost: key_centring_kernels.cuh; traffic and its floor:
// kernels/cuda/README.md, Key centring.
//
// Layouts: q (B, Hq, N, d), k and k_centred (B, Hkv, M, d), any batch/head/row
// strides, last dim contiguous; lse (B, Hq, L) FP32 with strides, lse_shifted
// (B, Hq, L_out) FP32 contiguous; kbar (B, Hkv, d) contiguous. q, k, k_centred
// and kbar share one element type (BF16, FP16 or FP32). head_dim <= 256. Rows
// and pointers 16-byte aligned take the kernel's 16-byte instantiation,
// anything else its one-element-at-a-time instantiation.
//
// Build: target gaugewatch_cuda (key_centring.cu, key_centring_launch.cu).
// Tests: tests/cuda/key_centring_test.cpp (GPU and CPU emulation).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/problem.h"

namespace gaugewatch::gpu {

enum class CentringPolicy : int {
  kAuto = 0,    // centre a coordinate where the offset dominates the spread
  kAlways = 1,
  kNever = 2,
};

struct KeyCentringParams {
  ProblemShape shape;  // batch, heads, lengths, head_dim, scale (masking unused)
  ElementType dtype = ElementType::kBf16;
  CentringPolicy policy = CentringPolicy::kAuto;
  double offset_spread_ratio = 2.0;  // "auto": centre c where |m_c| > ratio * s_c
  const void* q = nullptr;
  const void* k = nullptr;
  const float* lse = nullptr;
  OperandStrides q_strides, k_strides;
  int64_t lse_strides[3] = {0, 0, 1};  // batch, head, row
  int64_t lse_len = 0;                 // L >= N
  void* k_centred = nullptr;
  OperandStrides k_centred_strides;
  float* lse_shifted = nullptr;  // (B, Hq, L_out) contiguous
  int64_t lse_shifted_len = 0;   // L_out >= L (0: L); rows past L are written 0
  void* kbar = nullptr;          // (B, Hkv, d) contiguous
};

Status validate(const KeyCentringParams& params);

// Enqueues the two kernels on `stream`; never synchronizes, never aborts. No
// workspace: the blocks of a (b, hk) meet in distributed shared memory, and
// kernel 2 reads kbar from the `kbar` output.
Status center_keys(const KeyCentringParams& params, cudaStream_t stream);

}  // namespace gaugewatch::gpu
