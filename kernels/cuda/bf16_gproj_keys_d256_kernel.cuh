#pragma once
// Second pass of backend gproj at head dim 256 on the key-outer path
// (Bf16BackwardParams::d256_key_outer; math: kernels/cuda/bf16_backward.h,
// the pass itself: bf16_gproj_keys_kernel.cuh): after the head-dim-256
// key-outer kernel (bf16_keyouter_d256_kernel.cuh, P = kGproj) left
// dKacc_j = sum_i t_ij q_i and dQacc_i = sum_j t_ij k_j in FP32, and
// finish_rows_kernel<256, kGproj> lambda_i and the rows bf16(-lambda_i q_i),
// this pass adds C_j = sum_i r_ij bf16(-lambda_i q_i), rounded once into
// dK = bf16(alpha (dKacc_j + C_j)), and per key block and query tile
// -lambda_i U_i, U_i = sum_j r_ij k_j over the block's keys, into dQacc
// (finish_rows_kernel<256, kNone> then rounds dQ).
//
// gproj_keys_d256_kernel: the first pass's split (block: 256 threads, 64
// keys of one (batch, kv head), one block per SM, the same loop over the
// query tiles that see the keys, cp.async double buffering, two block
// barriers per iteration). Per iteration, warpgroup wg:
//   S = Q K_wg^T                  ss, m64n32 over D (keyouter256::scores_step:
//                                 the first pass's instructions)
//   r = bf16(P), P from the lse   hopper::probability on the m64n32
//                                 fragment (the first pass's r, bit for bit)
//   r -> shared [64 rows][64 keys], columns 32 wg.., then a block barrier
//   C[:, 128 wg..] += r^T bf16(-lambda Q)   ss, m64n128 over the tile's rows
//   U[:, 128 wg..] = r K          ss, m64n128 over the block's 64 keys
//   dQacc += -lambda_i U          staged over the iteration's tiles and added
//                                 by tensor reductions, as the first pass's
//                                 dQ (keyouter256::add_staged_rows)
// 3 products per tile pair (the first pass 5). Registers: C 64 FP32 per
// thread across the loop, U 64 and S 16 per iteration. Shared memory
// (Layout): K 32 KiB, two buffers of Q and bf16(-lambda Q) (32 KiB each),
// r 8 KiB, the rows' lse, key range and lambda: 171 KiB.
//
// Rounding: given the first pass's dKacc and lambda, dK is bitwise
// repeatable (FP32 add, then the scale, then one rounding); dQacc's terms
// land in atomic order. The mma.sync pair's C and U sum the same products
// in another order (FP32), so dK and dQ agree with the pair's to within
// that order's rounding, not bit for bit.
//
// Layouts: operands and outputs as bf16_backward.h; workspace: dk_accum
// (B, Hkv, M, d) FP32, dq_accum (B, Hq, N, d) FP32, row_factor (lambda,
// (B, Hq, N) FP32), neg_lambda_q (B, Hq, N, d) BF16. Build:
// bf16_keyouter_d256_gproj.cu; emulation:
// tests/cuda/emulation/bf16_launcher.cpp. Tests:
// tests/cuda/bf16_backward_test.cpp (HeadDim256GprojKeyOuter).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_gproj_keys_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_d256_kernel.cuh"

namespace gaugewatch::gpu::bf16::gproj_keys256 {

using keyouter256::kD;
using keyouter256::kKeys;
using keyouter256::kRows;
using keyouter256::kThreads;
using keyouter256::kWgCols;
using keyouter256::kWgKeys;

// Shared memory, BF16 element offsets from the 1024-byte aligned base: K
// ([64 keys][256]), Q and bf16(-lambda Q) of two buffers ([64 rows][256]),
// r ([64 rows][64 keys]), then the per-row arrays of both buffers
// (gproj_keys::StagedLse).
struct Layout {
  static constexpr int kTile = kRows * kD;
  static constexpr int kK = 0, kQ0 = kTile, kL0 = 2 * kTile, kQ1 = 3 * kTile, kL1 = 4 * kTile;
  static constexpr int kR = 5 * kTile;
  static constexpr int kStaged = kR + kRows * kKeys;
  static constexpr int kRowFloats = 2 * gproj_keys::kRowArrays * kRows;
  static constexpr size_t kBytes = static_cast<size_t>(kStaged) * 2 + kRowFloats * 4 + 1024;  // + alignment slack
};
static_assert(Layout::kBytes <= 227 * 1024, "one block of the head-dim-256 second pass per SM");

// (A template so that each translation unit has its own definition; D is
// 256.)
template <int D>
__global__ void __launch_bounds__(kThreads, 1) gproj_keys_d256_kernel(const __grid_constant__ tma::TensorMap dq_map,
                                                                       const Args a) {
  static_assert(D == kD, "the head-dim-256 second pass");
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout;
  const auto [j0, b, hk] = keyouter256::key_block(a);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int wg = __shfl_sync(0xffffffffu, warp >> 2,
                             0);  // uniform: the descriptors in uniform registers
  const int v = warp & 3, g = lane >> 2, c = lane & 3;
  const int row0 = 16 * v;  // this warp's first query row of a tile / first key of the block
  const bool issuer = threadIdx.x % wgmma::kWarpgroupThreads == 0;  // of its warpgroup's dQ reductions
  float* rows_base = reinterpret_cast<float*>(smem + L::kStaged);
  uint16_t* r_tile = smem + L::kR;

  const RowTiles seen = tiles_seeing_keys(a, j0, kKeys, kRows);
  const int t_begin = seen.first, tiles = seen.count;
  const int iters = tiles * a.group;
  auto tile_row0 = [&](int it) { return (t_begin + it % tiles) * kRows; };
  auto head_of = [&](int it) { return hk * a.group + it / tiles; };

  const KeyHead kh = key_head(a, b, hk);
  hopper::load_rows<kKeys, kD>(smem + L::kK, kh.k, a.k_strides.row, j0, a.m);
  auto stage = [&](int it, int buf) {
    gproj_keys::load_query_tile<kD>(a, b, head_of(it), tile_row0(it), smem + (buf ? L::kQ1 : L::kQ0),
                                    smem + (buf ? L::kL1 : L::kL0), rows_base, buf);
  };
  if (iters > 0) stage(0, 0);
  mma::cp_async_commit();

  float acc[kWgCols / 2];  // C, columns 128 wg..
  hopper::zero(acc);

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    // This iteration's loads arrive; both warpgroups are done with iteration
    // it - 1 (each waited for its MMAs, which read its buffers and r), and
    // its dQ reductions have read the partials staged over its buffers.
    if (issuer) bulk::wait_read();
    hopper::publish_buffer(false);
    if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);
      mma::cp_async_commit();
    }
    uint16_t* qs = smem + (buf ? L::kQ1 : L::kQ0);
    uint16_t* lqs = smem + (buf ? L::kL1 : L::kL0);
    const gproj_keys::TileRows tr = gproj_keys::tile_rows(gproj_keys::staged_lse(rows_base, buf), row0, g);

    float s[kWgKeys / 2];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) keyouter256::scores_step(s, qs, smem + L::kK, wg, kk);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(s);

    // r = bf16(P), P as the first pass's scores_to_tr forms it (the same
    // FFMA and ex2 on every visible element: the same bits), packed below.
    const int j_base = j0 + kWgKeys * wg;
    auto element = [&](int i, auto test) {
      const int half = (i >> 1) & 1;
      const int j = hopper::element_key(j_base, c, i);
      const bool visible = !decltype(test)::value || (j >= tr.kb[half] && j < tr.ke[half]);
      s[i] = hopper::probability(a, s[i], tr.lse_log2[half], visible);
    };
    hopper::for_each_tile_element<kWgKeys / 2>(tr.kb, tr.ke, j_base, element);
    keyouter256::store_scores(r_tile, s, row0 + g, wg, c);
    wgmma::fence_proxy_async();
    __syncthreads();  // U reads both warpgroups' halves of r

    float u[kWgCols / 2];
    wgmma::fence();
    keyouter256::keys_mma(acc, r_tile, lqs, wg);
    keyouter256::rows_mma(u, r_tile, smem + L::kK, wg);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
    wgmma::fence_operand(u);
    // -lambda_i U_i: one FP32 multiply per element (negation exact), as
    // gproj_keys::add_u.
#pragma unroll
    for (int i = 0; i < kWgCols / 2; ++i) u[i] *= -tr.lambda[(i >> 1) & 1];
    // Staged over this warpgroup's halves of bf16(-lambda Q) (which C has
    // read) and Q (read only by S), then added by tensor reductions
    // (keyouter256::add_staged_rows).
    keyouter256::stage_rows(lqs, qs, u, row0 + g, wg, c);
    keyouter256::add_staged_rows(&dq_map, lqs, qs, tile_row0(it), b * a.hq + head_of(it), wg, issuer);
  }
  mma::cp_async_wait<0>();
  if (issuer) bulk::wait_all();  // before the block's shared memory goes
  gproj_keys::write_dk<kD, kWgCols>(a, acc, j0, b, hk, row0, g, c, kWgCols * wg);
}

}  // namespace gaugewatch::gpu::bf16::gproj_keys256
