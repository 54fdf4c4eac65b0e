#pragma once
// Key-outer kernel of the fused BF16 backward at head dim 256, backends bf16
// and pivot (math: kernels/cuda/bf16_backward.h): FlashAttention-3's
// head-dim-256 split, 5 products per tile pair on the tensor cores where the
// mma.sync pair (the default at head dim 256) needs 7 through ldmatrix.
// Opt-in (Bf16BackwardParams::d256_key_outer; torch ops
// GAUGEWATCH_D256_KERNEL=key_outer) until it is measured on a GPU.
//
// Block: 256 threads (two warpgroups), 64 keys of one (batch, kv head),
// one block per SM; a loop over the 64-row query tiles of every query head
// of the group that see the keys (tiles_seeing_keys; keyouter_kernel's
// order), cp.async double buffering of the Q and dO tiles as keyouter_kernel
// (hopper::publish_buffer: one block barrier publishes iteration it's loads
// and orders every use of iteration it - 1's buffers before their reuse;
// the next loads are issued after it), and a second block barrier before
// the tile's dV, dK and dQ products (each warpgroup reads both halves of t
// and r).
// Per iteration, warpgroup wg:
//   S = Q K_wg^T, dP = dO V_wg^T   ss, m64n32 over D (16 k16 steps each):
//                                  keys 32 wg.. of the block (K-major)
//   t, r in registers              hopper::scores_to_tr on the m64n32
//                                  fragment (the same element math, bit for
//                                  bit, as every other kernel; rounded to
//                                  BF16 by the packing)
//   t, r -> shared [64 rows][64 keys], columns 32 wg.., then a block
//                                  barrier (each warpgroup reads both halves)
//   dV[:, 128 wg..] += r^T dO      ss, m64n128 over the tile's 64 rows: A = r
//   dK[:, 128 wg..] += t^T Q       (MN-major, all 64 keys), B = dO / Q
//                                  columns 128 wg.. (MN-major)
//   dQ_tile[:, 128 wg..] = t K     ss, m64n128 over the block's 64 keys: A = t
//                                  (K-major), B = K columns 128 wg..
//                                  (MN-major); added to the FP32 accumulator
//                                  dQacc by float2 atomics from the registers
//   pivot: per row, each warpgroup's partial sum of its rounded t (rho,
//                                  FP32 adds in the element order, then the
//                                  quad's) and its largest P with the key
//                                  (PivotArgmax, as keyouter_kernel's), by
//                                  atomics (FP32 add; 64-bit max)
// Registers: dK and dV 64 + 64 FP32 per thread across the loop, dQ 64 while
// the tile's products run (S and dP, 16 + 16, are dead by then).
// Shared memory (Layout): K and V 32 KiB each, two buffers of Q and dO
// (32 KiB each), t and r 8 KiB each, the rows' inputs: 212 KiB.
// Then finish_rows_kernel<256, P> (bf16_keyouter_finish_kernels.cuh):
// dQ = bf16(alpha dQacc) (pivot: minus rho_i k_{j*(i)}, and its dK fix-up),
// and for pivot finish_keys_kernel<256>. dV = bf16(dVacc) and dK =
// bf16(alpha dKacc) (pivot: dKacc in FP32, for the fix-up) are written by
// the block at the end (keys past M are not).
//
// Rounding (why this path is not bitwise repeatable, as keyouter_kernel):
// dQacc_i is the FP32 sum of the key blocks' FP32 tile partials in the order
// the atomics land; pivot's rho_i the FP32 sum of per-(block, warpgroup)
// partials in landing order, each partial its 32 keys' rounded t summed in
// FP32 by each lane (8 keys) and then over the quad; dKacc as
// keyouter_kernel's. The pivot j*(i) is exact (pivot_code). Every other
// value is computed as in the pair.
// deterministic = true keeps the mma.sync pair.
//
// Layouts: operands and outputs as bf16_backward.h; workspace: dQacc (B, Hq,
// N, d) FP32, zeroed by the launcher; pivot: rho in row_factor and the
// pivot codes (zeroed), dKacc (B, Hkv, M, d) FP32 (written whole). Build: bf16_keyouter_d256.cu;
// emulation: tests/cuda/emulation/bf16_launcher.cpp. Tests:
// tests/cuda/bf16_backward_test.cpp (HeadDim256KeyOuter).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/pivot_argmax.cuh"

namespace gaugewatch::gpu::bf16::keyouter256 {

inline constexpr int kD = 256;
inline constexpr int kKeys = 64;               // keys per block
inline constexpr int kRows = hopper::kKvRows;  // query rows per iteration
inline constexpr int kThreads = 256;
inline constexpr int kWgKeys = 32;   // S and dP: keys of each warpgroup
inline constexpr int kWgCols = 128;  // dV, dK and dQ: columns of each warpgroup
static_assert(kRows == 64 && kKeys == 64, "t and r are [64 rows][64 keys] tiles");

// Shared memory, BF16 element offsets from the 1024-byte aligned base: K,
// V ([64 keys][256]), Q and dO of two buffers ([64 rows][256]), t and r
// ([64 rows][64 keys]), then the per-row inputs of both buffers
// (hopper::StagedRows). Every [x][256] tile is four 64-column sub-tiles of
// 64 x 128 bytes (wgmma.cuh's swizzled layout).
struct Layout {
  static constexpr int kTile = kRows * kD;
  static constexpr int kK = 0, kV = kTile, kQ0 = 2 * kTile, kG0 = 3 * kTile, kQ1 = 4 * kTile, kG1 = 5 * kTile;
  static constexpr int kScoreTile = kRows * kKeys;
  static constexpr int kT = 6 * kTile, kR = kT + kScoreTile;
  static constexpr int kStaged = kR + kScoreTile;
  static constexpr int kRowFloats = 2 * hopper::kStagedArrays * kRows;
  static constexpr size_t kBytes = static_cast<size_t>(kStaged) * 2 + kRowFloats * 4 + 1024;  // + alignment slack
};
static_assert(Layout::kBytes <= 227 * 1024, "one block of the head-dim-256 key-outer kernel per SM");

// The grid: one block per (batch, kv head, 64 keys), in a.kv_sections
// sections of kv heads, key block first within a section (grid_order.cuh).
inline dim3 grid(const Args& a) { return hopper::key_block_grid<kKeys>(a); }

__device__ __forceinline__ hopper::KeyBlock key_block(const Args& a) {
  const int blocks = (a.m + kKeys - 1) / kKeys;
  const auto [kb, bhk] = grid_order::sectioned(static_cast<int>(blockIdx.x), a.batch * a.hkv, blocks, a.kv_sections);
  return {kb * kKeys, bhk / a.hkv, bhk % a.hkv};
}

template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) keyouter_d256_kernel(const Args a) {
  static_assert(P == Projection::kNone || P == Projection::kPivot, "bf16 and pivot");
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout;
  constexpr uint32_t kSubTile = kRows * 64 * 2;  // bytes between a tile's 64-column blocks (K's too: 64 keys)
  const auto [j0, b, hk] = key_block(a);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  // Broadcast from lane 0: ptxas then keeps what depends on the warpgroup
  // (the operands' descriptors) in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int v = warp & 3, g = lane >> 2, c = lane & 3;
  const int row0 = 16 * v;  // this warp's first query row of a tile / first key of the block
  float* rows_base = reinterpret_cast<float*>(smem + L::kStaged);
  uint16_t* t_tile = smem + L::kT;
  uint16_t* r_tile = smem + L::kR;

  const RowTiles seen = tiles_seeing_keys(a, j0, kKeys, kRows);
  const int t_begin = seen.first, tiles = seen.count;
  const int iters = tiles * a.group;

  const KeyHead kh = key_head(a, b, hk);
  hopper::load_rows<kKeys, kD>(smem + L::kK, kh.k, a.k_strides.row, j0, a.m);
  hopper::load_rows<kKeys, kD>(smem + L::kV, kh.v, a.v_strides.row, j0, a.m);

  auto tile_row0 = [&](int it) { return (t_begin + it % tiles) * kRows; };
  auto head_of = [&](int it) { return hk * a.group + it / tiles; };
  // The loads of iteration `it` into buffer `buf`: Q, dO and the per-row
  // inputs.
  auto stage = [&](int it, int buf) {
    hopper::load_query_tile<kD>(a, b, head_of(it), tile_row0(it), smem + (buf ? L::kQ1 : L::kQ0),
                                smem + (buf ? L::kG1 : L::kG0), rows_base, buf);
  };
  if (iters > 0) stage(0, 0);
  mma::cp_async_commit();

  float dk[kWgCols / 2], dv[kWgCols / 2];
  hopper::zero(dk);
  hopper::zero(dv);

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    // This iteration's loads (the only ones in flight) arrive, and every
    // thread is done with iteration it - 1: its MMAs, which read that
    // iteration's buffers and t and r, were waited for before it got here.
    hopper::publish_buffer(false);
    if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);  // the buffers of iteration it - 1
      mma::cp_async_commit();
    }
    const uint16_t* qs = smem + (buf ? L::kQ1 : L::kQ0);
    const uint16_t* gos = smem + (buf ? L::kG1 : L::kG0);
    const RowInputs in = hopper::staged_row_inputs(hopper::staged_rows(rows_base, buf), row0 + g);

    float s[kWgKeys / 2], dp[kWgKeys / 2];
    wgmma::fence();
    wgmma::mma_ss_first<false, false>(s, wgmma::desc_k_major(qs, 0),
                                      wgmma::desc_k_major(smem + L::kK, wgmma::chunk_offset<kKeys>(kWgKeys * wg, 0)));
    wgmma::mma_ss_first<false, false>(dp, wgmma::desc_k_major(gos, 0),
                                      wgmma::desc_k_major(smem + L::kV, wgmma::chunk_offset<kKeys>(kWgKeys * wg, 0)));
#pragma unroll
    for (int kk = 1; kk < kD / 16; ++kk) {
      const int x = wgmma::chunk_offset<kRows>(0, 2 * kk);
      const int y = wgmma::chunk_offset<kKeys>(kWgKeys * wg, 2 * kk);
      wgmma::mma_ss<false, false>(s, wgmma::desc_k_major(qs, x), wgmma::desc_k_major(smem + L::kK, y));
      wgmma::mma_ss<false, false>(dp, wgmma::desc_k_major(gos, x), wgmma::desc_k_major(smem + L::kV, y));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(s);
    wgmma::fence_operand(dp);
    // t and r only packed to BF16 below (the same bits, keyouter_kernel's
    // scores_to_tr<false>).
    hopper::scores_to_tr<false>(a, s, dp, in, j0 + kWgKeys * wg,
                                [](int, int, bool, float, float, float, float, int) {});
    if constexpr (P == Projection::kPivot) {
      // s holds P (0 where masked), dp the unrounded t: this warpgroup's
      // argmax and partial rho of rows g and g + 8 (the rounded t, the values
      // the MMAs consume), over the quad, added by lanes c = 0.
      keyouter::PivotArgmax argmax;
      float rho[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < kWgKeys / 2; ++i) {
        argmax.add((i >> 1) & 1, i, s[i]);
        rho[(i >> 1) & 1] += mma::round_bf16(dp[i]);
      }
      const int64_t row_base = (static_cast<int64_t>(b) * a.hq + head_of(it)) * a.n;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const unsigned long long best =
            keyouter::quad_max(argmax.code(hh, hopper::element_key(j0 + kWgKeys * wg, c, 0)));
        float sum = rho[hh];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int row = tile_row0(it) + row0 + g + 8 * hh;
        if (c == 0 && row < a.n) {
          if (best != 0) atomicMax(a.pivot_code + row_base + row, best);
          if (sum != 0.0f) atomicAdd(a.row_factor + row_base + row, sum);
        }
      }
    }
#pragma unroll
    for (int jn = 0; jn < kWgKeys / 8; ++jn) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int off = wgmma::tile_offset<kRows>(row0 + g + 8 * hh, kWgKeys * wg + 8 * jn + 2 * c);
        *reinterpret_cast<uint32_t*>(t_tile + off) = mma::pack_bf16(dp[4 * jn + 2 * hh], dp[4 * jn + 2 * hh + 1]);
        *reinterpret_cast<uint32_t*>(r_tile + off) = mma::pack_bf16(s[4 * jn + 2 * hh], s[4 * jn + 2 * hh + 1]);
      }
    }
    wgmma::fence_proxy_async();
    __syncthreads();  // both warpgroups' halves of t and r

    // dV and dK over the tile's rows 16 k.., dQ over the block's keys 16 k..;
    // this warpgroup's columns 128 wg.. (sub-tiles 2 wg, 2 wg + 1).
    const int column_block = 2 * wg * (kRows * 64);
    float dq[kWgCols / 2];
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kRows / 16; ++k) {
      const int step = wgmma::chunk_offset<kRows>(16 * k, 0);
      wgmma::mma_ss<true, true>(dv, wgmma::desc_mn_major(r_tile, step, kSubTile),
                                wgmma::desc_mn_major(gos + column_block, step, kSubTile));
      wgmma::mma_ss<true, true>(dk, wgmma::desc_mn_major(t_tile, step, kSubTile),
                                wgmma::desc_mn_major(qs + column_block, step, kSubTile));
    }
    wgmma::mma_ss_first<false, true>(
        dq, wgmma::desc_k_major(t_tile, 0),
        wgmma::desc_mn_major(smem + L::kK, wgmma::chunk_offset<kKeys>(0, kWgCols / 8 * wg), kSubTile));
#pragma unroll
    for (int k = 1; k < kKeys / 16; ++k) {
      wgmma::mma_ss<false, true>(
          dq, wgmma::desc_k_major(t_tile, wgmma::chunk_offset<kRows>(0, 2 * k)),
          wgmma::desc_mn_major(smem + L::kK, wgmma::chunk_offset<kKeys>(16 * k, kWgCols / 8 * wg), kSubTile));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(dk);
    wgmma::fence_operand(dv);
    wgmma::fence_operand(dq);

    // dQacc += the tile's partial, rows g and g + 8 of this warp, columns
    // 128 wg + 8 jn + 2 c.. (rows past N are not added).
    const int i0 = tile_row0(it);
    const int64_t row_base = (static_cast<int64_t>(b) * a.hq + head_of(it)) * a.n;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = i0 + row0 + g + 8 * hh;
      if (row >= a.n) continue;
      float* dst = a.dq_accum + (row_base + row) * kD + kWgCols * wg + 2 * c;
#pragma unroll
      for (int jn = 0; jn < kWgCols / 8; ++jn) {
        atomicAdd(reinterpret_cast<float2*>(dst + 8 * jn), make_float2(dq[4 * jn + 2 * hh], dq[4 * jn + 2 * hh + 1]));
      }
    }
  }
  mma::cp_async_wait<0>();

  // dK = bf16(alpha dKacc) (pivot: dKacc in FP32, for the fix-up), dV =
  // bf16(dVacc): keys row0 + g and + 8 of this warp, columns 128 wg + 8 jn +
  // 2 c. Keys past M are not written.
  const int64_t key_base = (static_cast<int64_t>(b) * a.hkv + hk) * a.m;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = j0 + row0 + g + 8 * hh;
    if (key >= a.m) continue;
    uint16_t* dko = output_row(a.dk, a.dk_strides, b, hk, key);
    uint16_t* dvo = output_row(a.dv, a.dv_strides, b, hk, key);
#pragma unroll
    for (int jn = 0; jn < kWgCols / 8; ++jn) {
      const int col = kWgCols * wg + 8 * jn + 2 * c;
      if constexpr (P == Projection::kPivot) {
        *reinterpret_cast<float2*>(a.dk_accum + (key_base + key) * kD + col) =
            make_float2(dk[4 * jn + 2 * hh], dk[4 * jn + 2 * hh + 1]);
      } else {
        *reinterpret_cast<uint32_t*>(dko + col) =
            mma::pack_bf16(a.scale * dk[4 * jn + 2 * hh], a.scale * dk[4 * jn + 2 * hh + 1]);
      }
      *reinterpret_cast<uint32_t*>(dvo + col) = mma::pack_bf16(dv[4 * jn + 2 * hh], dv[4 * jn + 2 * hh + 1]);
    }
  }
}

}  // namespace gaugewatch::gpu::bf16::keyouter256
