#pragma once
// Key-outer kernel of the fused BF16 backward at head dim 256, backends bf16,
// pivot and gproj's first pass (math: kernels/cuda/bf16_backward.h): FlashAttention-3's
// head-dim-256 split, 5 products per tile pair on the tensor cores where the
// mma.sync pair needs 7 through ldmatrix. bf16's and pivot's default at head
// dim 256 without bitwise determinism (Bf16BackwardParams::d256_key_outer;
// on the H200 0.63-0.65x the pair's time, kernels/cuda/README.md); gproj's
// first pass where gproj_path is kKeyOuter.
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
//                                  (MN-major); staged over this warpgroup's
//                                  halves of the iteration's dO and Q tiles
//                                  and added to the FP32 accumulator dQacc
//                                  by four TMA tensor reductions
//                                  (add_staged_rows)
//   pivot: per row, each warpgroup's partial sum of its rounded t (rho,
//                                  FP32 adds in the element order, then the
//                                  quad's) and its largest P with the key
//                                  (PivotArgmax, as keyouter_kernel's), by
//                                  atomics (FP32 add; 64-bit max)
//   gproj: per row, each warpgroup's partial sums of its rounded t (rho)
//                                  and r (m), as pivot's rho, by FP32
//                                  atomics
// Registers: dK and dV 64 + 64 FP32 per thread across the loop, dQ 64 while
// the tile's products run (S and dP, 16 + 16, are dead by then).
// Shared memory (Layout): K and V 32 KiB each, two buffers of Q and dO
// (32 KiB each), t and r 8 KiB each, the rows' inputs: 212 KiB.
// Then finish_rows_kernel<256, P> (bf16_keyouter_finish_kernels.cuh):
// dQ = bf16(alpha dQacc) (pivot: minus rho_i k_{j*(i)}, and its dK fix-up),
// and for pivot finish_keys_kernel<256>; gproj: finish_rows_kernel<256,
// kGproj> (lambda, bf16(-lambda q)), the second pass
// (bf16_gproj_keys_d256_kernel.cuh), then finish_rows_kernel<256, kNone>.
// dV = bf16(dVacc) and dK = bf16(alpha dKacc) (pivot and gproj: dKacc in
// FP32, for the fix-up or the second pass) are written by the block at the
// end (keys past M are not).
//
// Rounding (why this path is not bitwise repeatable, as keyouter_kernel):
// dQacc_i is the FP32 sum of the key blocks' FP32 tile partials in the order
// the atomics land; pivot's rho_i the FP32 sum of per-(block, warpgroup)
// partials in landing order, each partial its 32 keys' rounded t summed in
// FP32 by each lane (8 keys) and then over the quad; gproj's rho_i and m_i
// likewise (so lambda_i carries their landing order's rounding, as on
// keyouter_kernel); dKacc as keyouter_kernel's. The pivot j*(i) is exact (pivot_code). Every other
// value is computed as in the pair.
// deterministic = true keeps the mma.sync pair.
//
// Layouts: operands and outputs as bf16_backward.h; workspace: dQacc (B, Hq,
// N, d) FP32, zeroed by the launcher; pivot and gproj: rho in row_factor
// (zeroed), dKacc (B, Hkv, M, d) FP32 (written whole); pivot: the pivot
// codes (zeroed); gproj: m in mass_accum (zeroed). Build:
// bf16_keyouter_d256.cu (bf16, pivot), bf16_keyouter_d256_gproj.cu;
// emulation: tests/cuda/emulation/bf16_launcher.cpp. Tests:
// tests/cuda/bf16_backward_test.cpp (HeadDim256KeyOuter, HeadDim256GprojKeyOuter).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/bulk_reduce.cuh"
#include "kernels/cuda/keyouter_handoffs.cuh"
#include "kernels/cuda/pivot_argmax.cuh"
#include "kernels/cuda/tma.cuh"

namespace gaugewatch::gpu::bf16::keyouter256 {

inline constexpr int kD = 256;
inline constexpr int kKeys = kD256KeyBlockKeys;  // keys per block
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

// Step kk (a constant after unrolling; 16 steps over the head dim) of
// S = X K_wg^T, m64n32: the tile's 64 rows against this warpgroup's keys
// 32 wg.. of the block, X a [64][256] tile and the keys the block's
// [64][256] tile, both K-major. Issued (the caller commits and waits; step
// 0's scale-d 0 needs no zeroing). The first pass interleaves the steps of
// S and dP.
__device__ __forceinline__ void scores_step(float (&s)[kWgKeys / 2], const uint16_t* x, const uint16_t* keys, int wg,
                                            int kk) {
  const uint64_t xd = wgmma::desc_k_major(x, wgmma::chunk_offset<kRows>(0, 2 * kk));
  const uint64_t kd = wgmma::desc_k_major(keys, wgmma::chunk_offset<kKeys>(kWgKeys * wg, 2 * kk));
  if (kk == 0) {
    wgmma::mma_ss_first<false, false>(s, xd, kd);
  } else {
    wgmma::mma_ss<false, false>(s, xd, kd);
  }
}

// Bytes between a [64][256] tile's 64-column sub-tiles (K's too: 64 keys).
inline constexpr uint32_t kSubTile = kRows * 64 * 2;

// acc[:, 128 wg..] += A^T X over the tile's 64 rows: A a [64 rows][64 keys]
// score tile (t or r), X a [64 rows][256] tile (dO, Q or bf16(-lambda Q)),
// both MN-major; m64n128, 4 steps, issued.
__device__ __forceinline__ void keys_mma(float (&acc)[kWgCols / 2], const uint16_t* score_tile, const uint16_t* x,
                                         int wg) {
  const int column_block = 2 * wg * (kRows * 64);  // sub-tiles 2 wg, 2 wg + 1
#pragma unroll
  for (int k = 0; k < kRows / 16; ++k) {
    const int step = wgmma::chunk_offset<kRows>(16 * k, 0);
    wgmma::mma_ss<true, true>(acc, wgmma::desc_mn_major(score_tile, step, kSubTile),
                              wgmma::desc_mn_major(x + column_block, step, kSubTile));
  }
}

// out[:, 128 wg..] = A K over the block's 64 keys: A a [64 rows][64 keys]
// score tile (K-major), K the block's [64 keys][256] tile (MN-major);
// m64n128, 4 steps, issued (the first overwrites out).
__device__ __forceinline__ void rows_mma(float (&out)[kWgCols / 2], const uint16_t* score_tile, const uint16_t* keys,
                                         int wg) {
  wgmma::mma_ss_first<false, true>(
      out, wgmma::desc_k_major(score_tile, 0),
      wgmma::desc_mn_major(keys, wgmma::chunk_offset<kKeys>(0, kWgCols / 8 * wg), kSubTile));
#pragma unroll
  for (int k = 1; k < kKeys / 16; ++k) {
    wgmma::mma_ss<false, true>(
        out, wgmma::desc_k_major(score_tile, wgmma::chunk_offset<kRows>(0, 2 * k)),
        wgmma::desc_mn_major(keys, wgmma::chunk_offset<kKeys>(16 * k, kWgCols / 8 * wg), kSubTile));
  }
}

// A thread's two rows (row, row + 8: row0 + g of its warp) of an m64n32
// fragment (t or r: the 32 keys of its warpgroup) into a [64 rows][64 keys]
// tile, columns 32 wg..; packed to BF16 (round to nearest even).
__device__ __forceinline__ void store_scores(uint16_t* tile, const float (&x)[kWgKeys / 2], int row, int wg, int c) {
#pragma unroll
  for (int jn = 0; jn < kWgKeys / 8; ++jn) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int off = wgmma::tile_offset<kRows>(row + 8 * hh, kWgKeys * wg + 8 * jn + 2 * c);
      *reinterpret_cast<uint32_t*>(tile + off) = mma::pack_bf16(x[4 * jn + 2 * hh], x[4 * jn + 2 * hh + 1]);
    }
  }
}

// dQacc's map for the tensor reductions: boxes of 64 rows x 32 floats
// (tma::encode_f32_reduce_map). Host code.
inline bool encode_dq_map(const Args& a, tma::TensorMap* map) {
  return tma::encode_f32_reduce_map(map, keyouter::dq_accum_tensor<kD>(a), kRows) == tma::EncodeStatus::kOk;
}

// dQ partials through shared memory: once a warpgroup's products of an
// iteration are complete it reads nothing more of the iteration's row tiles
// but columns 128 wg.. of two of them (the first pass: dO and Q, for dV and
// dK; gproj's second pass: bf16(-lambda Q), for C), and nothing at all after
// the products; so its [64 rows][128] FP32 partial goes over those halves of
// two of the tiles (x, y: the tiles' sub-tiles 2 wg and 2 wg + 1, 16 KiB
// each), as four [64][32] boxes in the 128-byte swizzle
// (tma::f32_tile_offset: a warp's float2 stores meet no bank conflict),
// and one thread of the warpgroup adds them to dQacc by four tensor
// reductions (rows past N are not added). The next loads into these tiles
// are issued after the next iteration's first block barrier, which the
// issuing thread reaches only once the reductions have read them
// (bulk::wait_read).
__device__ __forceinline__ float* staging_box(uint16_t* x, uint16_t* y, int wg, int box) {
  return reinterpret_cast<float*>((box < 2 ? x : y) + (2 * wg + (box & 1)) * (kRows * 64));
}

// Stores this thread's m64n128 fragment x (rows `row` and row + 8 of the
// tile, columns 128 wg + 8 jn + 2 c..) into the staging boxes, once every
// warp of the warpgroup is past its wait for the products (named barrier
// 1 + wg): a warp's wait covers its own rows of a wgmma, and the other
// warps' rows may still be reading the tiles the stores overwrite (the CPU
// emulation computes the rows warp by warp, and without the barrier read
// the staged FP32 as dK's and dV's operands).
__device__ __forceinline__ void stage_rows(uint16_t* x_tile, uint16_t* y_tile, const float (&x)[kWgCols / 2],
                                           int row, int wg, int c) {
  wgmma::warpgroup_barrier(1 + wg);
#pragma unroll
  for (int jn = 0; jn < kWgCols / 8; ++jn) {
    float* box = staging_box(x_tile, y_tile, wg, jn / 4);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      *reinterpret_cast<float2*>(box + tma::f32_tile_offset<kRows>(row + 8 * hh, 8 * (jn % 4) + 2 * c)) =
          make_float2(x[4 * jn + 2 * hh], x[4 * jn + 2 * hh + 1]);
    }
  }
}

// The warpgroup's staged partial (stage_rows of all its threads) added to
// dQacc rows i0.. of head plane `plane`, columns 128 wg..: its threads fence
// their stores for the async proxy and meet (named barrier 1 + wg), then its
// first thread issues the four reductions into its bulk group.
__device__ __forceinline__ void add_staged_rows(const tma::TensorMap* dq_map, uint16_t* x_tile, uint16_t* y_tile,
                                                int i0, int plane, int wg, bool issuer) {
  wgmma::fence_proxy_async();
  wgmma::warpgroup_barrier(1 + wg);
  if (issuer) {
#pragma unroll
    for (int box = 0; box < 4; ++box) {
      tma::reduce_add_3d(dq_map, staging_box(x_tile, y_tile, wg, box), kWgCols * wg + 32 * box, i0, plane);
    }
    bulk::commit();
  }
}

// The sum of a row's value over its quad's four lanes.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The grid: one block per (batch, kv head, 64 keys), in a.kv_sections
// sections of kv heads, key block first within a section (grid_order.cuh).
inline dim3 grid(const Args& a) { return hopper::key_block_grid<kKeys>(a); }

__device__ __forceinline__ hopper::KeyBlock key_block(const Args& a) {
  const int blocks = (a.m + kKeys - 1) / kKeys;
  const auto [kb, bhk] = grid_order::sectioned(static_cast<int>(blockIdx.x), a.batch * a.hkv, blocks, a.kv_sections);
  return {kb * kKeys, bhk / a.hkv, bhk % a.hkv};
}

template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) keyouter_d256_kernel(const __grid_constant__ tma::TensorMap dq_map,
                                                                     const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout;
  const auto [j0, b, hk] = key_block(a);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  // Broadcast from lane 0: ptxas then keeps what depends on the warpgroup
  // (the operands' descriptors) in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int v = warp & 3, g = lane >> 2, c = lane & 3;
  const int row0 = 16 * v;  // this warp's first query row of a tile / first key of the block
  const bool issuer = threadIdx.x % wgmma::kWarpgroupThreads == 0;  // of its warpgroup's dQ reductions
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
    // iteration's buffers and t and r, were waited for before it got here,
    // and its dQ reductions have read the staged partials (over that
    // iteration's buffers, which the next loads overwrite).
    if (issuer) bulk::wait_read();
    hopper::publish_buffer(false);
    if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);  // the buffers of iteration it - 1
      mma::cp_async_commit();
    }
    uint16_t* qs = smem + (buf ? L::kQ1 : L::kQ0);
    uint16_t* gos = smem + (buf ? L::kG1 : L::kG0);
    const RowInputs in = hopper::staged_row_inputs(hopper::staged_rows(rows_base, buf), row0 + g);
    const int64_t row_base = (static_cast<int64_t>(b) * a.hq + head_of(it)) * a.n;
    const int row = tile_row0(it) + row0 + g;  // this thread's first row (the second: + 8)

    float s[kWgKeys / 2], dp[kWgKeys / 2];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      scores_step(s, qs, smem + L::kK, wg, kk);
      scores_step(dp, gos, smem + L::kV, wg, kk);
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
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const unsigned long long best =
            keyouter::quad_max(argmax.code(hh, hopper::element_key(j0 + kWgKeys * wg, c, 0)));
        const float sum = quad_sum(rho[hh]);
        if (c == 0 && row + 8 * hh < a.n) {
          if (best != 0) atomicMax(a.pivot_code + row_base + row + 8 * hh, best);
          if (sum != 0.0f) atomicAdd(a.row_factor + row_base + row + 8 * hh, sum);
        }
      }
    }
    if constexpr (P == Projection::kGproj) {
      // This warpgroup's partial sums of rows g and g + 8 of the rounded t
      // (rho) and r (m), over the quad, added by lanes c = 0 (rho) and 1 (m).
      float rho[2] = {0.0f, 0.0f}, mass[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < kWgKeys / 2; ++i) {
        rho[(i >> 1) & 1] += mma::round_bf16(dp[i]);
        mass[(i >> 1) & 1] += mma::round_bf16(s[i]);
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float x = quad_sum(rho[hh]), y = quad_sum(mass[hh]);
        const float mine = c == 0 ? x : y;
        if (c < 2 && row + 8 * hh < a.n && mine != 0.0f) {
          atomicAdd((c == 0 ? a.row_factor : a.mass_accum) + row_base + row + 8 * hh, mine);
        }
      }
    }
    store_scores(t_tile, dp, row0 + g, wg, c);
    store_scores(r_tile, s, row0 + g, wg, c);
    wgmma::fence_proxy_async();
    __syncthreads();  // both warpgroups' halves of t and r

    // dV and dK over the tile's rows, dQ over the block's keys; this
    // warpgroup's columns 128 wg...
    float dq[kWgCols / 2];
    wgmma::fence();
    keys_mma(dv, r_tile, gos, wg);
    keys_mma(dk, t_tile, qs, wg);
    rows_mma(dq, t_tile, smem + L::kK, wg);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(dk);
    wgmma::fence_operand(dv);
    wgmma::fence_operand(dq);
    stage_rows(gos, qs, dq, row0 + g, wg, c);
    add_staged_rows(&dq_map, gos, qs, tile_row0(it), b * a.hq + head_of(it), wg, issuer);
  }
  mma::cp_async_wait<0>();
  if (issuer) bulk::wait_all();  // before the block's shared memory goes

  // dK = bf16(alpha dKacc) (pivot and gproj: dKacc in FP32, for the fix-up
  // or the second pass), dV = bf16(dVacc): keys row0 + g and + 8 of this
  // warp, columns 128 wg + 8 jn + 2 c. Keys past M are not written.
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
      if constexpr (P == Projection::kNone) {
        *reinterpret_cast<uint32_t*>(dko + col) =
            mma::pack_bf16(a.scale * dk[4 * jn + 2 * hh], a.scale * dk[4 * jn + 2 * hh + 1]);
      } else {
        *reinterpret_cast<float2*>(a.dk_accum + (key_base + key) * kD + col) =
            make_float2(dk[4 * jn + 2 * hh], dk[4 * jn + 2 * hh + 1]);
      }
      *reinterpret_cast<uint32_t*>(dvo + col) = mma::pack_bf16(dv[4 * jn + 2 * hh], dv[4 * jn + 2 * hh + 1]);
    }
  }
}

}  // namespace gaugewatch::gpu::bf16::keyouter256
