#pragma once
// What the two kernel pairs of the fused BF16 backward share (math and
// layouts: kernels/cuda/bf16_backward.h): the launch arguments, the per-head
// operand pointers, a row's visible keys and per-row inputs, and the row
// statistics both dq kernels reduce. The Hopper pair (bf16_backward_hopper.cuh)
// and the mma.sync baseline (baseline/bf16_mma_sync_kernel.cuh) include this,
// not each other.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_backward.h"
#include "kernels/cuda/bf16_mma.cuh"
#include "kernels/cuda/masking.cuh"

namespace gaugewatch::gpu::bf16 {

// The block's dynamic shared memory. A macro so that the CPU emulation
// (tests/cuda/emulation/cuda_runtime.h) can supply its own block storage.
#ifndef GAUGEWATCH_BF16_SMEM
#define GAUGEWATCH_BF16_SMEM(name) extern __shared__ __align__(128) uint16_t name[]
#endif

inline constexpr float kLog2e = 1.4426950408889634f;
// Keys per block of the dK/dV and key-outer kernels (hopper::kKvKeys) and
// query rows per block of the dq kernel (hopper::kDqRows), here for the
// launcher's grid-size checks (1-D grids).
inline constexpr int kKeyBlockKeys = 128;
// Keys per block of gproj's wide second pass (bf16_gproj_keys_ws_kernel.cuh).
inline constexpr int kWideKeyBlockKeys = 256;
// Keys per block of the head-dim-256 key-outer kernels (keyouter256::kKeys).
inline constexpr int kD256KeyBlockKeys = 64;
inline constexpr int kQueryTileRows = 128;

// Device copy of the launch parameters (by value, in the kernel argument).
// n, m, hq, hkv: N, M, Hq, Hkv of the math (bf16_backward.h).
struct Args {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* grad_out;
  const float* lse;
  OperandStrides q_strides, k_strides, v_strides, grad_out_strides;
  LseStrides lse_strides;
  uint16_t* dq;
  uint16_t* dk;
  uint16_t* dv;
  OperandStrides dq_strides, dk_strides, dv_strides;  // even (32-bit stores)
  const float* delta;      // (B, Hq, N) workspace
  float* row_factor;       // gproj: lambda_i; pivot: rho_i     (B, Hq, N) workspace
  int32_t* pivot_key;      // pivot: j*(i)                     (B, Hq, N) workspace
  uint16_t* neg_lambda_q;  // gproj, Hopper pair: bf16(-lambda_i q_i), (B, Hq, N, d) workspace
  // Key-outer kernel (bf16_keyouter_kernel.cuh); row_factor then holds rho_i
  // (gproj: lambda_i once finish_rows_kernel has run).
  float* dq_accum;                 // FP32 dQ accumulator (B, Hq, N, d), zeroed
  unsigned long long* pivot_code;  // pivot: max (P, ~j) per row (B, Hq, N), zeroed
  float* dk_accum;                 // pivot, gproj: FP32 dK accumulator (B, Hkv, M, d)
  float* mass_accum;               // gproj: m_i = sum_j r_ij (B, Hq, N), zeroed
  int batch, hq, hkv, group;
  int n, m;
  float scale, scale_log2;
  int causal;  // CausalMode
  const int32_t* cu_q;
  const int32_t* cu_k;
  int num_segments;
  Bf16RowDiagnostics diag;
  // Sections of heads of the 1-D grids (grid_order.cuh): of the kv heads
  // for the key-block grids (wide_kv_sections: blocks of kWideKeyBlockKeys
  // keys), of the query heads for the query-tile grid; 1 to the heads' count.
  int kv_sections, q_sections, wide_kv_sections;
  // gproj's warp-specialized second pass: keys per block,
  // kKeyBlockKeys or kWideKeyBlockKeys (Bf16BackwardParams::gproj_pass2_keys).
  int gproj_pass2_keys;
};

struct DeltaArgs {
  const uint16_t* grad_out;
  const uint16_t* out;
  OperandStrides grad_out_strides, out_strides;
  float* delta;
  int hq, n, d;
  int64_t rows;  // B * Hq * N
};

// Launches delta_kernel (bf16_delta_kernel.cuh) from bf16_backward_delta.cu;
// the emulation has its own launcher.
cudaError_t launch_delta(const DeltaArgs& a, cudaStream_t stream);

// Row 0 of head h of batch element b in a (B, H, L, d) operand.
template <class T>
__device__ __forceinline__ T* head_ptr(T* base, const OperandStrides& s, int64_t b, int64_t h) {
  return base + b * s.batch + h * s.head;
}

// blockIdx.y read again at the point of use, as a value the compiler cannot
// merge with an earlier read: indices divided out of it there need no
// register across a kernel's main loop (the mma.sync dq kernel at two blocks
// per SM has none to spare for its (batch, head) until the dQ stores).
__device__ __forceinline__ int block_y_again() {
#if defined(GAUGEWATCH_CUDA_EMULATION)
  return static_cast<int>(blockIdx.y);
#else
  int y;
  asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(y));
  return y;
#endif
}

// blockIdx.x read again, as block_y_again: what is divided out of it after a
// main loop needs no register across it.
__device__ __forceinline__ int block_x_again() {
#if defined(GAUGEWATCH_CUDA_EMULATION)
  return static_cast<int>(blockIdx.x);
#else
  int x;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(x));
  return x;
#endif
}

// Row `row` of head h of batch element b in a (B, H, L, d) output (dq, dk, dv
// at their strides).
__device__ __forceinline__ uint16_t* output_row(uint16_t* base, const OperandStrides& s, int64_t b, int64_t h,
                                                int64_t row) {
  return base + b * s.batch + h * s.head + row * s.row;
}

// One query head's operands and the index of its row 0 in the (B, Hq, N)
// workspace arrays (delta, row_factor, pivot_key) and row diagnostics.
struct QueryHead {
  const uint16_t* q;
  const uint16_t* grad_out;
  const float* lse;
  int64_t row_base;
};

__device__ __forceinline__ QueryHead query_head(const Args& a, int b, int h) {
  return {head_ptr(a.q, a.q_strides, b, h), head_ptr(a.grad_out, a.grad_out_strides, b, h),
          a.lse + b * a.lse_strides.batch + h * a.lse_strides.head, (static_cast<int64_t>(b) * a.hq + h) * a.n};
}

// One key/value head's operands.
struct KeyHead {
  const uint16_t* k;
  const uint16_t* v;
};

__device__ __forceinline__ KeyHead key_head(const Args& a, int b, int hk) {
  return {head_ptr(a.k, a.k_strides, b, hk), head_ptr(a.v, a.v_strides, b, hk)};
}

__device__ __forceinline__ KeyRange row_keys(const Args& a, int row) {
  if (row >= a.n) return {0, 0};
  return visible_keys(a.cu_q, a.cu_k, a.num_segments, a.n, a.m, a.causal, row);
}

// First row in [lo, hi) for which pred(row) holds, pred monotone (false..true).
template <class Pred>
__device__ __forceinline__ int first_row(int lo, int hi, Pred pred) {
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// The query-row tiles (of `rows_per_tile` rows) of which some row sees a key
// of [j0, j0 + keys): visible ranges are monotone along the rows, so two
// binary searches bound them. Tiles first .. first + count - 1.
struct RowTiles {
  int first;
  int count;
};

__device__ __forceinline__ RowTiles tiles_seeing_keys(const Args& a, int j0, int keys, int rows_per_tile) {
  const int j1 = j0 + keys < a.m ? j0 + keys : a.m;
  const int r_begin = first_row(0, a.n, [&](int r) { return row_keys(a, r).end > j0; });
  const int r_end = first_row(r_begin, a.n, [&](int r) { return row_keys(a, r).begin >= j1; });
  const int first = r_begin / rows_per_tile;
  const int end = r_begin < r_end ? (r_end + rows_per_tile - 1) / rows_per_tile : first;
  return {first, end - first};
}

// Per-row inputs of phase 1 for the two rows a thread holds (g and g + 8 of
// its warp's 16).
struct RowInputs {
  float lse_log2[2];
  float delta[2];
  int kb[2], ke[2];
};

// RowInputs of rows first + g and first + g + 8 (this thread's two rows,
// lane = 4 g + c) of one query head (its lse, QueryHead::lse, and row_base,
// QueryHead::row_base).
__device__ __forceinline__ RowInputs row_inputs(const Args& a, int first, const float* lse, int64_t row_base) {
  const int g = (threadIdx.x & 31) >> 2;
  RowInputs in;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = first + g + 8 * hh;
    const KeyRange kr = row_keys(a, row);
    in.kb[hh] = kr.begin;
    in.ke[hh] = kr.end;
    in.lse_log2[hh] = row < a.n && kr.end > kr.begin ? lse[row] * kLog2e : 0.0f;
    in.delta[hh] = row < a.n ? a.delta[row_base + row] : 0.0f;
  }
  return in;
}

// Statistics of this thread's two rows over the keys it visited: rho, m, and
// for the diagnostics and pivot sum |t|, max |alpha s|, max P and its key.
struct RowStats {
  float rho[2] = {0, 0}, mass[2] = {0, 0}, abs_rho[2] = {0, 0}, pmax[2] = {-1, -1}, lmax[2] = {0, 0};
  int parg[2] = {-1, -1};

  // One visited element (keys in increasing j per thread: ties keep the lower).
  template <bool kDiag, bool kArgmax>
  __device__ __forceinline__ void add(int hh, int j, bool visible, float p, float t, float r, float scaled_s) {
    rho[hh] += t;
    mass[hh] += r;
    if constexpr (kDiag) {
      abs_rho[hh] += fabsf(t);
      if (visible) lmax[hh] = fmaxf(lmax[hh], fabsf(scaled_s));
    }
    if constexpr (kArgmax) {
      if (visible && p > pmax[hh]) {
        pmax[hh] = p;
        parg[hh] = j;
      }
    }
  }

  // Combines the 4 lanes of each row (fixed xor order; argmax ties to the
  // lower key).
  __device__ __forceinline__ void reduce_quad() {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        rho[hh] += __shfl_xor_sync(0xffffffffu, rho[hh], off);
        mass[hh] += __shfl_xor_sync(0xffffffffu, mass[hh], off);
        abs_rho[hh] += __shfl_xor_sync(0xffffffffu, abs_rho[hh], off);
        lmax[hh] = fmaxf(lmax[hh], __shfl_xor_sync(0xffffffffu, lmax[hh], off));
        const float op = __shfl_xor_sync(0xffffffffu, pmax[hh], off);
        const int oa = __shfl_xor_sync(0xffffffffu, parg[hh], off);
        if (op > pmax[hh] || (op == pmax[hh] && oa >= 0 && (parg[hh] < 0 || oa < parg[hh]))) {
          pmax[hh] = op;
          parg[hh] = oa;
        }
      }
    }
  }
};

}  // namespace gaugewatch::gpu::bf16
