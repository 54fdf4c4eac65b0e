#pragma once
// The key-outer kernels' finish (math and rounding: bf16_keyouter_kernel.cuh):
// finish_rows_kernel turns each row's FP32 dQ accumulator into BF16 dQ (pivot:
// minus rho_i k_{j*(i)}, and its dK fix-up), or for gproj, before its second
// pass, computes lambda_i and the rows bf16(-lambda_i q_i) that pass reads
// (gproj's dQ is then finish_rows_kernel<D, kNone> after the second pass);
// finish_keys_kernel pivot's FP32 dK accumulator into BF16 dK. Launched by
// launch_keyouter_finish (bf16_keyouter_launch.cuh) after either key-outer
// kernel; emulation: tests/cuda/emulation/bf16_launcher.cpp.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_keyouter_kernel.cuh"

namespace gaugewatch::gpu::bf16::keyouter {

inline constexpr int kFinishRows = 64;      // query rows per finish_rows block
inline constexpr int kFinishThreads = 128;
inline constexpr int kConvertThreads = 256;  // finish_keys_kernel
inline constexpr int kConvertColumns = 8;    // per finish_keys thread
// Pivot's dK fix-up in finish_rows_kernel: the 64 sorted rows in segments of
// this many, one segment per group of D / 4 threads (four columns each).
template <int D>
inline constexpr int kFixupRows = kFinishRows * (D / 4) / kFinishThreads;
// finish_rows_kernel's shared memory: rho, j*, the tile's rows sorted by j*
// and (pivot) the tile's query rows.
template <int D, Projection P>
inline constexpr size_t kFinishSmemBytes =
    3 * kFinishRows * 4 + (P == Projection::kPivot ? static_cast<size_t>(kFinishRows) * D * 2 : 0);

// dQ of 64 query rows of one head from the FP32 accumulator (pivot: minus
// rho_i k_{j*(i)}), and pivot's dK fix-up: dKacc_j -= sum of rho_i q_i over
// the tile's rows with j*(i) = j, one FP32 sum per (j, column) in increasing
// i, then one atomic. gproj (no dQ here): lambda_i = rho_i / m_i (0 when
// m_i = 0) into row_factor (over rho_i) and bf16(-lambda_i q_i) per row for
// the second pass, rounded as the pair's dq kernel rounds them.
template <int D, Projection P>
__global__ void __launch_bounds__(kFinishThreads) finish_rows_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  float* rho = reinterpret_cast<float*>(raw);
  int* pivot = reinterpret_cast<int*>(rho + kFinishRows);
  int* order = pivot + kFinishRows;  // tile rows sorted by (j*, row); rows with no pivot last
  uint16_t* q_rows = reinterpret_cast<uint16_t*>(order + kFinishRows);  // pivot: [64][D], 16-byte aligned
  const int i0 = static_cast<int>(blockIdx.x) * kFinishRows;
  const int bh = blockIdx.y;
  const int b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
  const int64_t row_base = static_cast<int64_t>(bh) * a.n;
  const int tid = threadIdx.x;

  if constexpr (P == Projection::kPivot) {
    // The tile's query rows, all in flight at once (the fix-up below reads
    // them row after row).
    const uint16_t* qh = head_ptr(a.q, a.q_strides, b, h);
    constexpr int kChunks = D / 8;
    for (int idx = tid; idx < kFinishRows * kChunks; idx += kFinishThreads) {
      const int r = idx / kChunks, chunk = idx % kChunks;
      const bool ok = i0 + r < a.n;
      mma::cp_async_16(q_rows + r * D + 8 * chunk, qh + (ok ? static_cast<int64_t>(i0 + r) * a.q_strides.row : 0) +
                                                         8 * chunk, ok);
    }
    mma::cp_async_commit();
    if (tid < kFinishRows) {
      const int row = i0 + tid;
      const bool ok = row < a.n;
      rho[tid] = ok ? a.row_factor[row_base + row] : 0.0f;
      pivot[tid] = ok ? pivot_of(a.pivot_code[row_base + row]) : -1;
    }
    mma::cp_async_wait<0>();
    __syncthreads();
    if (tid < kFinishRows) {
      auto sort_key = [&](int r) { return pivot[r] < 0 ? 0x7fffffff : pivot[r]; };
      const int mine = sort_key(tid);
      int rank = 0;
      for (int r = 0; r < kFinishRows; ++r) {
        const int other = sort_key(r);
        rank += (other < mine || (other == mine && r < tid)) ? 1 : 0;
      }
      order[rank] = tid;
    }
    __syncthreads();
  }
  if constexpr (P == Projection::kGproj) {
    if (tid < kFinishRows) {
      const int row = i0 + tid;
      const float m = row < a.n ? a.mass_accum[row_base + row] : 0.0f;
      const float lam = m > 0.0f ? a.row_factor[row_base + row] / m : 0.0f;
      rho[tid] = lam;
      if (row < a.n) a.row_factor[row_base + row] = lam;  // the second pass's -lambda_i U_i
    }
    __syncthreads();
  }

  constexpr int kQuads = D / 4;
  constexpr int kPerThread = kFinishRows * kQuads / kFinishThreads;  // quads of the tile per thread
  static_assert(kFinishRows * kQuads % kFinishThreads == 0, "every thread takes the same number of quads");
  if constexpr (P == Projection::kGproj) {
    // bf16(-lambda_i q_i), the B operand of the second pass (the sign folded
    // in: negation is exact in BF16), four columns per 8-byte load (rows
    // 16-byte aligned). Every load of the thread first, then the products
    // and stores: the compiler cannot move a load of q past a store to
    // neg_lambda_q (same element type), so one at a time they would each
    // wait a round trip to memory.
    const uint16_t* qh = head_ptr(a.q, a.q_strides, b, h);
    uint2 qq[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int idx = tid + k * kFinishThreads;
      const int row = i0 + idx / kQuads, col = 4 * (idx % kQuads);
      qq[k] = row < a.n ? *reinterpret_cast<const uint2*>(qh + static_cast<int64_t>(row) * a.q_strides.row + col)
                        : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int idx = tid + k * kFinishThreads;
      const int r = idx / kQuads, col = 4 * (idx % kQuads);
      if (i0 + r >= a.n) continue;
      const float lam = rho[r];
      auto scaled = [&](uint32_t word, int half) {
        return -lam * mma::bf16_bits_to_float(static_cast<uint16_t>(word >> (16 * half)));
      };
      *reinterpret_cast<uint2*>(a.neg_lambda_q + (row_base + i0 + r) * D + col) =
          make_uint2(mma::pack_bf16(scaled(qq[k].x, 0), scaled(qq[k].x, 1)),
                     mma::pack_bf16(scaled(qq[k].y, 0), scaled(qq[k].y, 1)));
    }
    return;
  }

  // dQ, kBatch quads of the thread at a time: their loads (dQacc, and for
  // pivot k_{j*}) first, then the arithmetic and the stores, so that the
  // loads overlap (a load of K cannot pass a store to dQ for the compiler:
  // same element type).
  const KeyHead kh = key_head(a, b, hk);
  constexpr int kBatch = kPerThread < 8 ? kPerThread : 8;
  static_assert(kPerThread % kBatch == 0, "whole batches per thread");
#pragma unroll
  for (int k0 = 0; k0 < kPerThread; k0 += kBatch) {
    float4 acc[kBatch];
    [[maybe_unused]] uint2 kq[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int idx = tid + (k0 + k) * kFinishThreads;
      const int r = idx / kQuads, col = 4 * (idx % kQuads);
      const bool ok = i0 + r < a.n;
      acc[k] = ok ? *reinterpret_cast<const float4*>(a.dq_accum + (row_base + i0 + r) * D + col)
                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if constexpr (P == Projection::kPivot) {
        // Four BF16 of k_{j*} in one 8-byte load (rows 16-byte aligned, col % 4 == 0).
        kq[k] = ok && pivot[r] >= 0
                    ? *reinterpret_cast<const uint2*>(kh.k + static_cast<int64_t>(pivot[r]) * a.k_strides.row + col)
                    : make_uint2(0u, 0u);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int idx = tid + (k0 + k) * kFinishThreads;
      const int r = idx / kQuads, col = 4 * (idx % kQuads);
      const int row = i0 + r;
      if (row >= a.n) continue;
      float x[4] = {acc[k].x, acc[k].y, acc[k].z, acc[k].w};
      if constexpr (P == Projection::kPivot) {
        if (pivot[r] >= 0) {
          const uint32_t words[2] = {kq[k].x, kq[k].y};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            x[e] -= rho[r] * mma::bf16_bits_to_float(static_cast<uint16_t>(words[e >> 1] >> (16 * (e & 1))));
          }
        }
      }
      uint32_t* out = reinterpret_cast<uint32_t*>(output_row(a.dq, a.dq_strides, b, h, row) + col);
      out[0] = mma::pack_bf16(a.scale * x[0], a.scale * x[1]);
      out[1] = mma::pack_bf16(a.scale * x[2], a.scale * x[3]);
    }
  }

  if constexpr (P == Projection::kPivot) {
    // Thread: four columns (quad) of one segment of kFixupRows consecutive
    // sorted rows; one float4 atomic per pivot key of its segment.
    float* dk_head = a.dk_accum + (static_cast<int64_t>(b) * a.hkv + hk) * a.m * D;
    const int quad = tid % kQuads, s0 = tid / kQuads * kFixupRows<D>;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = s0; s < s0 + kFixupRows<D>; ++s) {
      const int r = order[s];
      const int j = pivot[r];
      if (j < 0) break;
      const uint2 qq = *reinterpret_cast<const uint2*>(q_rows + r * D + 4 * quad);
      sum.x = fmaf(rho[r], mma::bf16_bits_to_float(static_cast<uint16_t>(qq.x)), sum.x);
      sum.y = fmaf(rho[r], mma::bf16_bits_to_float(static_cast<uint16_t>(qq.x >> 16)), sum.y);
      sum.z = fmaf(rho[r], mma::bf16_bits_to_float(static_cast<uint16_t>(qq.y)), sum.z);
      sum.w = fmaf(rho[r], mma::bf16_bits_to_float(static_cast<uint16_t>(qq.y >> 16)), sum.w);
      if (s + 1 == s0 + kFixupRows<D> || pivot[order[s + 1]] != j) {
        atomicAdd(reinterpret_cast<float4*>(dk_head + static_cast<int64_t>(j) * D + 4 * quad),
                  make_float4(-sum.x, -sum.y, -sum.z, -sum.w));
        sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  }
}

// Pivot: dK = bf16(alpha dKacc), kConvertColumns consecutive elements per
// thread (two 16-byte loads; the stores stay 4-byte words, as dK's rows need
// only be even); grid (M D / 8 / kConvertThreads, B * Hkv): blockIdx.y is the
// (batch, kv head), so dK's strides need no division of a flat index. (A
// template so that each head dim's translation unit has its own definition.)
template <int D>
__global__ void __launch_bounds__(kConvertThreads) finish_keys_kernel(const Args a) {
  static_assert(D % kConvertColumns == 0, "a thread's columns lie in one row");
  const int bhk = blockIdx.y;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kConvertThreads + threadIdx.x;  // in this head
  if (chunk >= static_cast<int64_t>(a.m) * (D / kConvertColumns)) return;
  const float4* in =
      reinterpret_cast<const float4*>(a.dk_accum + (static_cast<int64_t>(bhk) * a.m * D + kConvertColumns * chunk));
  const float4 lo = in[0], hi = in[1];
  const int key = static_cast<int>(chunk / (D / kConvertColumns));
  const int col = static_cast<int>(kConvertColumns * (chunk % (D / kConvertColumns)));
  uint32_t* out = reinterpret_cast<uint32_t*>(output_row(a.dk, a.dk_strides, bhk / a.hkv, bhk % a.hkv, key) + col);
  out[0] = mma::pack_bf16(a.scale * lo.x, a.scale * lo.y);
  out[1] = mma::pack_bf16(a.scale * lo.z, a.scale * lo.w);
  out[2] = mma::pack_bf16(a.scale * hi.x, a.scale * hi.y);
  out[3] = mma::pack_bf16(a.scale * hi.z, a.scale * hi.w);
}

}  // namespace gaugewatch::gpu::bf16::keyouter
