#pragma once
// Key-outer one-pass Hopper kernel of the fused BF16 backward, backends bf16,
// pivot and gproj's first pass (math: kernels/cuda/bf16_backward.h), the
// fallback of the warp-specialized kernel (bf16 and pivot's default without
// bitwise determinism) and its baseline; for gproj where
// Bf16BackwardParams::gproj_path chooses it (GprojPath: by default at head
// dim 64, and at 128 where it runs warp-specialized). One
// kernel computes the five products per tile pair (S, dP, dV, dK, dQ) where
// the two-kernel pair of bf16_backward_hopper.cuh needs seven; dQ is
// accumulated in FP32 by atomics. gproj adds the row sums of r (m) and a
// second pass over the keys (bf16_gproj_keys_kernel.cuh: S, C = r^T
// bf16(-lambda Q) for dK, U = r K for dQ) once lambda is known.
//
// keyouter_kernel: block = 128 keys of one (batch, kv head), two warpgroups
// (wg: keys 64 wg..), loop over query tiles of 64 rows of every query head of
// the group, causal skipping and cp.async double buffering as the pair's
// dkdv kernel (same shared layout, hopper::KvLayout<D, kNone>), with one block
// barrier per iteration (D = 128: two) instead of its two: the barrier that
// publishes iteration it's loads also orders every use of the previous
// iteration's buffers before their reuse (the next loads are issued after it,
// the previous dQ tile is added to dQacc after it, and at D = 64 the dQ
// partials alternate between two buffers):
//   S = Q K_wg^T, dP = dO V_wg^T   ss, m64n64 (hopper::scores_mma)
//   t, r in registers              hopper::scores_to_tr: the same element
//                                  math, bit for bit, as both pair kernels
//                                  (rounded to BF16 by the packing)
//   t, r -> shared [64 rows][64 keys] per warpgroup, then a block barrier
//                                  (D = 64: a warpgroup barrier)
//   dV += r^T dO, dK += t^T Q      ss, m64nD, A and B MN-major
//   dQ_tile = t K                  ss, m64n64, A = t (K-major), B = K (MN-major)
//                                  D = 128: warpgroup wg computes columns
//                                  64 wg.. over all 128 keys (t of both
//                                  warpgroups) into a shared FP32 staging
//                                  tile, and after the next barrier 64
//                                  threads add its rows to dQacc, one bulk
//                                  reduction each (bulk_reduce.cuh); in
//                                  the warp-specialized kernel at both
//                                  head dims (gproj: D = 128) warpgroup wg
//                                  computes columns D / 2 wg.. (D = 64:
//                                  m64n32) and a writer warp adds the tile;
//                                  D = 64: each warpgroup its own 64 keys'
//                                  partial into shared memory, and after the
//                                  next barrier the block adds the two
//                                  partials and dQacc += them by float4
//                                  atomics (one atomic per element, and no
//                                  warpgroup skips an MMA: a branch around
//                                  wgmma makes ptxas serialize them)
//   pivot: per row, this block's partial sums of t (rho; per warpgroup, on
//   the tensor cores: t against a [64 keys][8] tile of ones, m64n8k16, beside
//   dQ's MMAs) and its max P with the key index, both by atomics (FP32 add;
//   64-bit max of pivot_code()); in the warp-specialized kernel the
//   writer warp adds both warpgroups' in one atomic of each per row
//   (StatsHandoff).
//   gproj: per row, this block's partial sums of the BF16-rounded t (rho)
//   and r (m), per warpgroup on the tensor cores as pivot's rho (t and r
//   against the tile of ones, 4 m64n8k16 steps each), by FP32 atomics (in
//   the warp-specialized kernel by the writer warp, both warpgroups' in one
//   of each per row, as pivot's); dQ as bf16's; dK is left in FP32 (dKacc).
// Then finish_rows_kernel (per 64 query rows): dQ = bf16(alpha (dQacc -
// rho_i k_{j*(i)})) (pivot) or bf16(alpha dQacc) (bf16; gproj after its
// second pass, which adds -lambda_i U_i to dQacc); gproj first: lambda_i =
// rho_i / m_i and bf16(-lambda_i q_i), the pair's rounding, for the second
// pass; for pivot it also subtracts
// rho_i q_i from the FP32 dK accumulator of key j*(i), the rows of its tile
// grouped by pivot key first and split into segments of kFixupRows (one
// float4 atomic per key, segment and four columns, so many rows sharing one
// pivot, e.g. an attention sink, do not serialize on it).
// finish_keys_kernel (pivot) rounds dK = bf16(alpha dKacc).
//
// Rounding (why this path is not bitwise repeatable): dQacc_i is the FP32 sum
// of the blocks' FP32 tile partials in the order the atomics land; rho_i the
// FP32 sum of the per-(block, warpgroup) partial row sums, in landing order
// (pivot, and gproj for rho and m: each partial the tensor cores' FP32 sum
// of the warpgroup's 64 rounded t_ij (r_ij), an m64n8k16 product against
// ones; pivot with the writer warp (the warp-specialized kernel): per block
// the FP32 sum of its two warpgroups' partials, warpgroup 0's first);
// dKacc_j (pivot) the kernel's FP32 accumulator minus, in landing order, one
// FP32 sum per segment of kFixupRows sorted rows of a query tile of the
// rho_i q_i of its rows with j*(i) = j; gproj:
// rho_i and m_i FP32 sums of per-(block, warpgroup) partials in landing order
// (so lambda_i, and through it the BF16 rows -lambda_i q_i, carry that
// order's rounding), dQacc_i also summing the second pass's FP32 terms
// -lambda_i U_i (per key block and query tile) in landing order, dKacc_j no
// atomics. The
// pivot j*(i) itself is exact: the 64-bit max of (bits of P, ~j) picks the
// largest P and, among equal P, the lowest key, whatever the order, as the
// pair's dq kernel does. Every other value is computed as in the pair.
// deterministic = true (Bf16BackwardParams) keeps the two-kernel pair, as
// does gproj where gproj_path does not choose this path.
//
// Layouts: operands and outputs as bf16_backward.h; workspace (zeroed by the
// launcher unless stated): dQacc (B, Hq, N, d) FP32; pivot and gproj: rho in
// row_factor (B, Hq, N) FP32, dKacc (B, Hkv, M, d) FP32 (written whole by the
// kernel, not zeroed); pivot: pivot_code (B, Hq, N) u64; gproj: m in
// mass_accum (B, Hq, N) FP32, lambda_i (in row_factor, over rho_i) and
// neg_lambda_q (B, Hq, N, d) BF16 written by finish_rows_kernel.
// The per-tile work (KeyTile below) is shared with the warp-specialized
// variant (bf16_keyouter_ws_kernel.cuh: TMA producer
// warpgroup, mbarrier ring; the default), which replaces only the loads and the
// block barriers around it.
// The finish kernels: bf16_keyouter_finish_kernels.cuh.
// Build: instantiated in bf16_keyouter_d{64,128}.cu and (gproj)
// bf16_keyouter_d{64,128}_gproj.cu; emulation:
// tests/cuda/emulation/bf16_launcher.cpp. Tests: tests/cuda/bf16_backward_test.cpp
// (Bf16KeyOuterCase, PivotSinkSharedByEveryRow, GprojKeyOuterSinkLikeRowMass,
// ...), tests/python/test_gpu_bf16_backward.py.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/bulk_reduce.cuh"
#include "kernels/cuda/keyouter_handoffs.cuh"
#include "kernels/cuda/pivot_argmax.cuh"
#include "kernels/cuda/tma.cuh"

namespace gaugewatch::gpu::bf16::keyouter {

using hopper::kKvKeys;
using hopper::kKvRows;
using hopper::kThreads;

// The shared layout of the pair's dkdv kernel without the projection's tiles;
// then the FP32 dQ of the iteration: at D = 64 each warpgroup's partial
// [64 rows][72], two sets (iterations alternate), or with the writer warp
// (kWriter) one dense [64 rows][64] staging tile of both column halves, at
// D = 128 the staging tile [64 rows][136] of both halves.
// Row strides of 8 floats past a multiple of 32 banks: the 8 rows of a warp's
// float2 stores hit distinct banks; 16-byte aligned rows for the bulk copy.
// Pivot and gproj: then 1 KiB of BF16
// ones, the B operand (8 columns x 64 keys, K-major) of the row sums of t
// (and r) on the tensor cores (kRowSumsByMma).
template <int D>
inline constexpr int kDqStride = D + 8;
// Whether a warpgroup's row sums of its rounded t tile (pivot's rho; gproj's
// rho and, of r, m) come from the tensor cores (m64n8k16 against a tile of
// ones, 4 steps each beside dQ's MMAs) rather than from FP32 instructions in
// the element loop (round, widen, add: three per element and sum), which
// bound the kernel at D = 64.
template <int D, Projection P>
inline constexpr bool kRowSumsByMma = P == Projection::kPivot || P == Projection::kGproj;
template <int D, Projection P = Projection::kNone, bool kWriter = false>
struct Layout : hopper::KvLayout<D, Projection::kNone> {
  using Base = hopper::KvLayout<D, Projection::kNone>;
  static constexpr size_t kDqTileBytes =
      static_cast<size_t>(kKvRows) * (D == 64 && kWriter ? 64 : kDqStride<D>) * 4;
  static constexpr size_t kDqPartial = static_cast<size_t>(Base::kRows) * 2 + Base::kRowFloats * 4;  // bytes
  static constexpr int kTiles = D == 64 && !kWriter ? 4 : 1;
  static constexpr size_t kOnes = kDqPartial + kTiles * kDqTileBytes;  // bytes
  static constexpr size_t kOnesBytes = kRowSumsByMma<D, P> ? 1024 : 0;
  static constexpr size_t kBytes = Base::kBytes + kTiles * kDqTileBytes + kOnesBytes;
  // Bytes from the aligned base to the end of the dQ tiles (and the ones):
  // where the warp-specialized kernel's second set of t tiles starts (D =
  // 128, KeyTile::kTSets).
  static constexpr size_t kDqEnd = kOnes + kOnesBytes;
  static_assert(kDqPartial % 1024 == 0 && kDqTileBytes % 1024 == 0, "tiles start 1024-byte aligned");
};

// The per-tile work of one block, shared by keyouter_kernel (below) and the
// warp-specialized keyouter_ws_kernel (bf16_keyouter_ws_kernel.cuh): both run
// it on two compute warpgroups (256 threads; tid is the thread's index among
// them, warpgroup wg = tid / 128 owns keys j0 + 64 wg..; kFirstThread: the
// block's thread index of tid 0). What differs is who loads the query tiles
// and how the block synchronizes around them. kWriter (warp-specialized
// kernel): the compute threads hand each dQ tile to a writer warp
// (DqHandoff, writer_loop) instead of adding it themselves after a barrier
// of all 256; dQ is then one tile over the block's 128 keys, each warpgroup
// D / 2 of its columns (D = 64: m64n32), and t alternates between two sets of
// tiles, since warpgroup 0 may store iteration it + 1's t while warpgroup 1's
// dQ MMAs still read iteration it's. (Two partials per tile, as the compute
// threads add them at D = 64 without the writer, cost a writer warp more
// than the compute threads: 1.36x by float4 atomics from one warp, 2.0x by
// bulk reductions of both, on the H200; kernels/cuda/README.md.)
template <int D, Projection P, int kFirstThread = 0, bool kWriter = false>
struct KeyTile {
  static_assert(D == 64 || D == 128, "dQ: one D / 2-column block per warpgroup, or two key halves (64)");
  using L = Layout<D, P, kWriter>;
  static constexpr bool kGproj = P == Projection::kGproj;
  // Whether dQ is staged in one tile and added by the copy engine (bulk
  // reductions of its rows; with kWriter tensor reductions of the tile):
  // each warpgroup then computes D / 2 columns over all 128 keys, otherwise
  // (D = 64 without the writer) all 64 columns over its own 64 keys.
  static constexpr bool kStaged = D == 128 || kWriter;
  // This warpgroup's dQ accumulator: m64n(D / 2) staged, m64n64 otherwise.
  static constexpr int kDqFloats = kStaged ? D / 4 : 32;
  static constexpr int kTSets = kWriter ? 2 : 1;  // sets of t tiles
  // Pivot (rho) and gproj (rho and m): each warpgroup's row sums of its t
  // (r) tile from the tensor cores (kRowSumsByMma).
  static constexpr bool kRhoByMma = kRowSumsByMma<D, P>;
  static constexpr bool kMassByMma = kRhoByMma && kGproj;
  // With the writer warp at D = 128, bf16 and gproj: the tile's dQ MMAs
  // (and the row sums that the statistics before the hand-over read) are
  // issued and waited for first, and the dQ tile is stored and handed over
  // while dV's and dK's MMAs, issued after them, run; the stage's buffers
  // are released once those are done. Measured (H200, three rounds,
  // 2026-12-06): bf16's kernel 0.970-0.976x, gproj's first pass
  // 0.935-0.978x at D = 128; pivot's 1.006-1.030x (its rho then from the
  // tile: from registers it spilled beside this), so pivot keeps the order
  // below; at D = 64 (H100) bf16's 1.031x, pivot's 1.019x.
  static constexpr bool kDqFirst = kWriter && D == 128 && P != Projection::kPivot;
  // Whether the row sums take t's (rho) and r's (gproj's m) A fragments
  // from registers rather than the tiles from shared memory: in the
  // warp-specialized kernel (kWriter), m only at D = 64. Held until the MMAs
  // complete, the fragments spilled in the other kernels (ptxas, nvcc 13.0:
  // gproj's r beside t at D = 128 4 bytes; keyouter_kernel at D = 128, pivot
  // 28 bytes, gproj 4).
  static constexpr bool kRhoFromRegisters = kRhoByMma && kWriter;
  static constexpr bool kMassFromRegisters = kMassByMma && kWriter && D == 64;
  // Pivot and gproj with the writer warp: each warpgroup's per-row
  // statistics (pivot: the argmax code, reduced over the quad, and rho;
  // gproj: m and rho) are staged in shared memory and the writer adds both
  // warpgroups' with one atomic of each per row (StatsHandoff), instead of
  // every warpgroup's c = 0 (and gproj's c = 1) lanes adding their own: half
  // the atomics, and none on the compute warps. On the H200 pivot's kernel
  // took 0.90-0.95x its time on the five D = 128 shapes; at D = 64, with a
  // warp of the producer warpgroup doing only this while the compute threads
  // still added dQ, 1.001x
  // (bench/results/bench_bf16_backward-stats-writer-h200-2026-12-04.md); at
  // D = 64 the dQ writer does it beside the tile.
  static constexpr bool kStatsByWriter = kWriter && kRhoByMma;
  // Pivot and gproj at D = 64 with the writer (warp-specialized): the row
  // sums' MMAs in a commit group of their own after dV / dK / dQ's, waited
  // for, and the statistics staged for the writer (pivot's code and rho,
  // gproj's m and rho), only after the dQ tile's hand-over, whose
  // proxy fence then waits for the dQ stores alone. On the H200 (three
  // rounds of alternating processes,
  // bench/results/bench_bf16_backward-stats-after-handoff-h200-2026-12-05.md)
  // pivot's kernel took 0.955x its time at D = 64, but 1.026-1.032x on the
  // five D = 128 shapes (1.039-1.042x with the row sums left in the tile's
  // group), and gproj's first pass 0.98-1.00x at D = 128: those keep the
  // statistics before the hand-over. gproj's at D = 64: 0.978x on the H100
  // (bench/results/bench_bf16_backward-gproj-d64-writer-h100-2026-12-05.md;
  // without the writer it had measured 1.015x).
  static constexpr bool kStatsAfterHandoff = kWriter && kRhoByMma && D == 64;
  static constexpr uint32_t kSubTile = kKvRows * 64 * 2;     // bytes between a row tile's 64-column blocks
  static constexpr uint32_t kKeySubTile = kKvKeys * 64 * 2;  // the same for the K tile
  static constexpr int kStride = kDqStride<D>;
  static constexpr int kPartialFloats = kKvRows * kStride;  // one warpgroup's partial

  const Args& a;
  uint16_t* smem;  // 1024-byte aligned, Layout<D, P>
  int j0, b, hk;
  int t_begin, tiles;  // the query tiles that see the block's keys (tiles_seeing_keys)
  // kStatsByWriter: StatsHandoff::kBytes of shared memory, 8-byte aligned.
  unsigned char* stats_base = nullptr;
  // This thread's warpgroup (0 or 1), broadcast from lane 0 once, where the
  // block constructs the tile: ptxas then knows it is warp-uniform and keeps
  // what depends on it (the operands' descriptors) in uniform registers.
  int wg_uniform = __shfl_sync(0xffffffffu, tid() >> 7, 0);

  // 0 .. 255 over the two compute warpgroups (from threadIdx: the compiler
  // knows its range from the launch bounds).
  __device__ __forceinline__ static int tid() { return static_cast<int>(threadIdx.x) - kFirstThread; }

  // Iteration it is query tile it % tiles of head it / tiles of the group
  // (no division without GQA: it is the tile).
  __device__ __forceinline__ int tile_row0(int it) const {
    return (t_begin + (a.group == 1 ? it : it % tiles)) * kKvRows;
  }
  __device__ __forceinline__ int head_of(int it) const { return hk * a.group + (a.group == 1 ? 0 : it / tiles); }
  __device__ __forceinline__ int iterations() const { return tiles * a.group; }
  __device__ __forceinline__ float* partial() const {
    return reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(smem) + L::kDqPartial);
  }
  __device__ __forceinline__ float* rows_base() const { return reinterpret_cast<float*>(smem + L::kRows); }
  // kStatsByWriter: the staged statistics and their two mbarriers.
  __device__ __forceinline__ StatsHandoff<P> stats() const { return StatsHandoff<P>{stats_base}; }
  // Whether this thread issues bulk reductions (and waits for their reads).
  __device__ __forceinline__ bool issues_rows() const {
    return kStaged && !kWriter && tid() < kKvRows;
  }
  // Pivot and gproj: the ones tile (kRhoByMma), one word per compute thread, fenced for
  // the tensor cores; the caller's next barrier of the 256 publishes it.
  __device__ __forceinline__ void fill_ones() const {
    if constexpr (kRhoByMma) {
      reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(smem) + L::kOnes)[tid()] = 0x3f803f80u;
      static_assert(L::kOnesBytes == 4 * kThreads, "one word per compute thread");
      wgmma::fence_proxy_async();
    }
  }

  // sum = tile 1: the row sums of a warpgroup's [64 rows][64 keys] BF16 tile,
  // from its A fragments in registers (the values stored to the tile),
  // against the ones tile (B, desc `ones`), 4 m64n8k16 steps; every column
  // holds the row sum, exact products and FP32 sums. The first step's
  // scale-d 0 needs no zeroing between the fences. The fragments must stay
  // unchanged until the MMAs are waited for.
  __device__ __forceinline__ static void row_sums_mma(float (&sum)[4], const uint32_t (&frag)[4][4], uint64_t ones) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k == 0) {
        wgmma::mma_rs_first<false>(sum, frag[k], ones);
      } else {
        wgmma::mma_rs<false>(sum, frag[k], ones);
      }
    }
  }
  // The same from the tile in shared memory (K-major A; kRhoFromRegisters,
  // kMassFromRegisters false).
  __device__ __forceinline__ static void row_sums_mma(float (&sum)[4], const uint16_t* tile, uint64_t ones) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t tk = wgmma::desc_k_major(tile, wgmma::chunk_offset<kKvRows>(0, 2 * k));
      if (k == 0) {
        wgmma::mma_ss_first<false, false>(sum, tk, ones);
      } else {
        wgmma::mma_ss<false, false>(sum, tk, ones);
      }
    }
  }

  // t of warpgroup w in iteration it: set 0 beside r (t0, r0, t1, r1), set 1
  // (kTSets == 2) the two t tiles after the dQ tiles.
  __device__ __forceinline__ uint16_t* t_of(int it, int w) const {
    if (kTSets == 2 && (it & 1) != 0) {
      return reinterpret_cast<uint16_t*>(reinterpret_cast<unsigned char*>(smem) + L::kDqEnd) + w * L::kScoreTile;
    }
    return smem + L::kTr + w * 2 * L::kScoreTile;
  }

  // dQacc += the dQ tile of iteration `it`, once a barrier has published
  // it, by the 256 compute threads (t: this thread's index among them; not
  // kWriter). D = 64: the two warpgroups' partials (set it % 2) summed, by
  // float4 atomics; D = 128: the staging tile, one bulk reduction per row
  // (threads 0..63).
  __device__ __forceinline__ void add_dq_tile(int it, int t) const {
    static_assert(!kWriter, "the writer warp adds the tile (writer_loop)");
    const int i0 = tile_row0(it);
    const int64_t row_base = (static_cast<int64_t>(b) * a.hq + head_of(it)) * a.n;
    float* part = partial();
    if constexpr (D == 64) {
      constexpr unsigned kQuads = 64 / 4;
      constexpr int kPerThread = kKvRows * kQuads / kThreads;
      static_assert(kKvRows * kQuads % kThreads == 0, "every compute thread adds the same number of quads");
      constexpr int kRowStep = kThreads / kQuads;  // rows between a thread's quads
      // Thread t adds quad t % 16 of rows t / 16 + 16 k: one shared and one
      // global base, the k-th quad at a constant offset from each.
      const int r0 = t / static_cast<int>(kQuads), col = 4 * (t % static_cast<int>(kQuads));
      const float* src = part + (it & 1) * 2 * kPartialFloats + r0 * kStride + col;
      float* dst = a.dq_accum + (row_base + i0 + r0) * D + col;
      const int rows = a.n - i0 - r0;  // this thread's rows in the tile
      if (rows > (kPerThread - 1) * kRowStep) {
        // Every row in the tile: all loads first, so that their latencies
        // overlap, then the sums and the atomics.
        float4 x[kPerThread], y[kPerThread];
#pragma unroll
        for (int k = 0; k < kPerThread; ++k) {
          x[k] = *reinterpret_cast<const float4*>(src + k * kRowStep * kStride);
          y[k] = *reinterpret_cast<const float4*>(src + kPartialFloats + k * kRowStep * kStride);
        }
#pragma unroll
        for (int k = 0; k < kPerThread; ++k) {
          atomicAdd(reinterpret_cast<float4*>(dst + k * kRowStep * D),
                    make_float4(x[k].x + y[k].x, x[k].y + y[k].y, x[k].z + y[k].z, x[k].w + y[k].w));
        }
        return;
      }
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        if (k * kRowStep >= rows) break;
        const float4 x = *reinterpret_cast<const float4*>(src + k * kRowStep * kStride);
        const float4 y = *reinterpret_cast<const float4*>(src + kPartialFloats + k * kRowStep * kStride);
        atomicAdd(reinterpret_cast<float4*>(dst + k * kRowStep * D),
                  make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
      }
    } else {
#pragma unroll
      for (int r = t; r < kKvRows; r += kThreads) {
        if (i0 + r >= a.n) return;
        bulk::reduce_add_f32(a.dq_accum + (row_base + i0 + r) * D, part + r * kStride, D * 4);
        bulk::commit();
      }
    }
  }

  // The writer warp's loop (kWriter; lane 0..31): per iteration, wait for the
  // staging tile (full), add it to dQacc (dq_map: the accumulator as a
  // (B Hq, N, D) FP32 tensor, DqHandoff::add_tile), and once the reductions
  // have read it hand it back to both warpgroups (empty) when a later
  // iteration will store it again. Then wait for the last reductions (before
  // the block's shared memory goes).
  __device__ __forceinline__ void writer_loop(int lane, const tma::TensorMap* dq_map) const {
    static_assert(kWriter, "the writer warp belongs to the warp-specialized kernel");
    DqHandoff::writer_loop(iterations(), [&](int it) {
      DqHandoff::add_tile<D>(dq_map, b * a.hq + head_of(it), tile_row0(it), partial(), lane);
      if constexpr (kStatsByWriter) add_stats(it, lane);  // while the copy engine reads the tile
    });
  }

  // The writer warp's lane `lane`: iteration it's staged statistics added to
  // its query head's row arrays (pivot: pivot_code; gproj: mass_accum; both
  // row_factor; StatsHandoff::add).
  __device__ __forceinline__ void add_stats(int it, int lane) const {
    const int64_t row_base = (static_cast<int64_t>(b) * a.hq + head_of(it)) * a.n;
    if constexpr (kGproj) {
      stats().add(it, lane, tile_row0(it), a.n, a.mass_accum + row_base, a.row_factor + row_base);
    } else {
      stats().add(it, lane, tile_row0(it), a.n, a.pivot_code + row_base, a.row_factor + row_base);
    }
  }

  // kStatsByWriter: the stats hand-over's barriers, initialized by one thread
  // of the block before the block synchronizes (a no-op otherwise).
  __device__ __forceinline__ void init_stats() const {
    if constexpr (kStatsByWriter) stats().init();
  }

  // x packed to BF16 into this warpgroup's [64 rows][64 keys] tile.
  __device__ __forceinline__ void store_tile(uint16_t* tile, const float (&x)[32]) const {
    static_assert(kKvRows == 64, "wgmma::store_accumulator_tile writes [64 rows][64 keys] tiles");
    wgmma::store_accumulator_tile(tile, x, (tid() >> 5) & 3, tid() & 31);
  }

  // Pivot: this thread's two rows' candidates over its 16 keys of the tile
  // (PivotArgmax::code).
  __device__ __forceinline__ void argmax_codes(const PivotArgmax& argmax, unsigned long long (&code)[2]) const {
    const int wg = (tid() >> 5) >> 2, c = (tid() & 31) & 3;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      code[hh] = argmax.code(hh, hopper::element_key(j0 + 64 * wg, c, 0));
    }
  }

  // Pivot: the codes reduced over the quad (the row's 64 keys of this
  // warpgroup) and added by atomics (64-bit max).
  __device__ __forceinline__ void add_argmax(const unsigned long long (&code)[2], int i0, int64_t row_base) const {
    const int g = (tid() & 31) >> 2, c = tid() & 3, row0 = 16 * ((tid() >> 5) & 3);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const unsigned long long best = quad_max(code[hh]);
      const int row = i0 + row0 + g + 8 * hh;
      if (c == 0 && row < a.n && best != 0) atomicMax(a.pivot_code + row_base + row, best);
    }
  }

  // Iteration `it` on the query tile qs, gos (Q, dO; [64][D] each) with its
  // per-row inputs ra: S, dP, t, r, the statistics' atomics, dV += r^T dO,
  // dK += t^T Q, and the dQ tile into the partials / staging tile (added by
  // add_dq_tile(it) after the next barrier, or with kWriter handed to the
  // writer warp, DqHandoff). cross_sync(): the barrier of
  // the 256 compute threads where a staged dQ reads both warpgroups' t;
  // released(): called once the MMAs that read qs, gos and ra are done
  // (the tile's buffers may be refilled after it).
  template <class CrossSync, class Released>
  __device__ __forceinline__ void compute(int it, const uint16_t* qs, const uint16_t* gos,
                                          const hopper::StagedRows& ra, float (&dk)[D / 2], float (&dv)[D / 2],
                                          CrossSync&& cross_sync, Released&& released) const {
    const int warp = tid() >> 5, lane = tid() & 31;
    const int wg = wg_uniform, v = warp & 3, g = lane >> 2, c = lane & 3;
    const int row0 = 16 * v;  // this warp's first query row of a tile / first key of its warpgroup's 64
    uint16_t* t_tile = t_of(it, wg);
    uint16_t* r_tile = smem + L::kTr + wg * 2 * L::kScoreTile + L::kScoreTile;  // t0, r0, t1, r1
    float* part = partial();
    const int i0 = tile_row0(it);
    const int64_t row_base = (static_cast<int64_t>(b) * a.hq + head_of(it)) * a.n;

    const RowInputs in = hopper::staged_row_inputs(ra, row0 + g);
    float s[32], dp[32];  // written by scores_mma (its first step does not read them)
    if (wg == 1) wgmma::pingpong_wait(hopper::kPingpongBarrier);
    wgmma::fence();
    hopper::scores_mma<D, kKvRows, kKvKeys>(s, qs, 0, smem + L::kK, 64 * wg);
    hopper::scores_mma<D, kKvRows, kKvKeys>(dp, gos, 0, smem + L::kV, 64 * wg);
    wgmma::commit();
    if (wg == 0) wgmma::pingpong_arrive(hopper::kPingpongBarrier);
    wgmma::wait<0>();
    wgmma::fence_operand(s);
    wgmma::fence_operand(dp);
    // t and r are only packed to BF16 below (scores_to_tr<false>: the
    // same bits for fewer conversions, and s keeps P in FP32, 0 where
    // masked: pivot's argmax reads it once the MMAs are issued); pivot's
    // row sums take the rounded t, the values the MMAs consume.
    hopper::scores_to_tr<false>(a, s, dp, in, j0 + 64 * wg,
                                [](int, int, bool, float, float, float, float, int) {});
    // kWriter: no barrier of all compute threads has passed since this
    // warpgroup's MMAs of the previous iteration read its r tile: its
    // four warps meet before overwriting it. (t goes to the other set,
    // which both warpgroups' MMAs finished reading before the last
    // compute barrier.)
    if constexpr (kWriter) wgmma::warpgroup_barrier(1 + wg);
    // kRhoFromRegisters (kMassFromRegisters): t (r) packed once, stored as
    // the tile and kept in registers as the A operand of the row sums.
    [[maybe_unused]] uint32_t t_frag[kRhoFromRegisters ? 4 : 1][4];
    [[maybe_unused]] uint32_t r_frag[kMassFromRegisters ? 4 : 1][4];
    if constexpr (kRhoFromRegisters) {
      wgmma::accumulator_to_a(t_frag, dp);
      wgmma::store_fragment_tile(t_tile, t_frag, (tid() >> 5) & 3, tid() & 31);
    } else {
      store_tile(t_tile, dp);
    }
    if constexpr (kMassFromRegisters) {
      wgmma::accumulator_to_a(r_frag, s);
      wgmma::store_fragment_tile(r_tile, r_frag, (tid() >> 5) & 3, tid() & 31);
    } else {
      store_tile(r_tile, s);
    }
    // Staged (D = 128, or the writer): dQ reads the t of both warpgroups, a
    // barrier of the compute threads (after which the staging tile is
    // rewritten: its reads by the previous bulk reductions are done); D = 64
    // without the writer: each warpgroup reads only its own t and r.
    wgmma::fence_proxy_async();
    if constexpr (kStaged) {
      if (issues_rows()) bulk::wait_read();  // kWriter: the writer waits, DqHandoff's empty barrier
      cross_sync();
    } else {
      wgmma::warpgroup_barrier(1 + wg);
    }

    float dq[kDqFloats];
    hopper::zero(dq);
    // Pivot and gproj: rho = t 1 over this warpgroup's 64 keys (columns all
    // equal; the first step's scale-d 0 needs no zeroing between the
    // fences); gproj: m = r 1 likewise.
    [[maybe_unused]] float rho[4];
    [[maybe_unused]] float mass[kMassByMma ? 4 : 1];
    auto issue_dv_dk = [&] {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int step = wgmma::chunk_offset<kKvRows>(16 * k, 0);  // rows 16 k.. of every [64][*] tile
        wgmma::mma_ss<true, true>(dv, wgmma::desc_mn_major(r_tile, step, kSubTile),
                                  wgmma::desc_mn_major(gos, step, kSubTile));
        wgmma::mma_ss<true, true>(dk, wgmma::desc_mn_major(t_tile, step, kSubTile),
                                  wgmma::desc_mn_major(qs, step, kSubTile));
      }
    };
    // dQ: keys 16 k.. are t of warpgroup k / 4 (its keys 16 (k % 4)..) and K
    // rows 16 k..; staged: all 128 keys, columns D / 2 wg.. (D / 16 chunks of
    // 16 bytes per column block); D = 64 without the writer: own keys.
    auto issue_dq = [&] {
      constexpr int kDqSteps = kStaged ? 8 : 4;
#pragma unroll
      for (int kq = 0; kq < kDqSteps; ++kq) {
        const int k = kStaged ? kq : 4 * wg + kq;
        const uint16_t* tw = t_of(it, k >> 2);
        const int column_chunk = kStaged ? D / 16 * wg : 0;
        wgmma::mma_ss<false, true>(
            dq, wgmma::desc_k_major(tw, wgmma::chunk_offset<kKvRows>(0, 2 * (k & 3))),
            wgmma::desc_mn_major(smem + L::kK, wgmma::chunk_offset<kKvKeys>(16 * k, column_chunk), kKeySubTile));
      }
    };
    auto issue_row_sums = [&] {
      if constexpr (kRhoByMma) {
        const uint64_t ones = wgmma::desc_k_major(reinterpret_cast<const unsigned char*>(smem) + L::kOnes);
        if constexpr (kRhoFromRegisters) {
          row_sums_mma(rho, t_frag, ones);
        } else {
          row_sums_mma(rho, t_tile, ones);
        }
        if constexpr (kMassFromRegisters) {
          row_sums_mma(mass, r_frag, ones);
        } else if constexpr (kMassByMma) {
          row_sums_mma(mass, r_tile, ones);
        }
      }
    };
    wgmma::fence();
    if constexpr (kDqFirst) {
      // dQ (and the row sums the hand-over waits for) in the first commit
      // group, dV and dK in the second: the dQ tile is stored and handed
      // over while dV's and dK's MMAs run.
      issue_dq();
      if constexpr (!kStatsAfterHandoff) issue_row_sums();
      wgmma::commit();
      issue_dv_dk();
      if constexpr (kStatsAfterHandoff) issue_row_sums();
      wgmma::commit();
    } else {
      issue_dv_dk();
      issue_dq();
      if constexpr (kStatsAfterHandoff) wgmma::commit();
      issue_row_sums();
      wgmma::commit();
    }
    [[maybe_unused]] unsigned long long code[2];
    if constexpr (P == Projection::kPivot) {
      // Pivot's argmax from P (in s) while the tile's MMAs run: integer
      // work off the path between the MMAs (formed in the element loop, it
      // delays their issue).
      PivotArgmax argmax;
#pragma unroll
      for (int i = 0; i < 32; ++i) argmax.add((i >> 1) & 1, i, s[i]);
      argmax_codes(argmax, code);
      if constexpr (kStatsByWriter) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) code[hh] = quad_max(code[hh]);
      } else {
        add_argmax(code, i0, row_base);
      }
    }

    if constexpr (kDqFirst) {
      wgmma::wait<1>();
      wgmma::fence_operand(dq);
    } else {
      wgmma::wait<kStatsAfterHandoff ? 1 : 0>();
      wgmma::fence_operand(dk);
      wgmma::fence_operand(dv);
      wgmma::fence_operand(dq);
      released();
    }
    auto add_statistics = [&] {
      if constexpr (kStatsAfterHandoff) wgmma::wait<0>();  // the row sums' group
      if constexpr (kStatsByWriter) {
        // This warpgroup's partial rho of rows g and g + 8 and pivot's argmax
        // codes or gproj's partial m, staged for the writer (lanes c = 0
        // store: they hold the quad's codes; every column holds a row sum).
        wgmma::fence_operand(rho);
        if constexpr (kGproj) {
          wgmma::fence_operand(mass);
          stats().stage(it, wg, row0 + g, c == 0, {mass[0], mass[2]}, rho[0], rho[2]);
        } else {
          stats().stage(it, wg, row0 + g, c == 0, code, rho[0], rho[2]);
        }
      } else if constexpr (kMassByMma) {
        // This warpgroup's partial rho and m of rows g and g + 8: every
        // column holds the row sum, so lane c = 0 adds rho and lane c = 1 m,
        // one atomic instruction per row (a fully masked row adds nothing).
        wgmma::fence_operand(rho);
        wgmma::fence_operand(mass);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = i0 + row0 + g + 8 * hh;
          const float x = c == 0 ? rho[2 * hh] : mass[2 * hh];
          if (c < 2 && row < a.n && x != 0.0f) atomicAdd((c == 0 ? a.row_factor : a.mass_accum) + row_base + row, x);
        }
      } else if constexpr (kRhoByMma) {
        // This warpgroup's partial rho of rows g and g + 8 (a fully masked
        // row has t = 0 and adds nothing).
        wgmma::fence_operand(rho);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = i0 + row0 + g + 8 * hh;
          if (c == 0 && row < a.n && rho[2 * hh] != 0.0f) atomicAdd(a.row_factor + row_base + row, rho[2 * hh]);
        }
      }
    };
    if constexpr (!kStatsAfterHandoff) add_statistics();
    // kWriter: the staging tile is free once the writer's reductions of
    // iteration it - 1 have read it; without: see below.
    if constexpr (kWriter) DqHandoff::acquire(it, wg);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // D = 64 without the writer: this warpgroup's partial in set it % 2
      // (free: iteration it - 2's were added before this iteration's first
      // barrier); D = 128: its column half of the staging tile (free: see
      // the wait above). kWriter: the staging tile in the tensor reductions'
      // swizzled layout (columns D / 2 wg + 8 jn + 2 c: one XOR and a
      // constant per store).
      const int r = row0 + g + 8 * hh;
      float* mine = kStaged ? part + r * kStride + 64 * wg + 2 * c
                            : part + ((it & 1) * 2 + wg) * kPartialFloats + r * kStride + 2 * c;
      const int x = tma::f32_tile_offset<kKvRows>(r, D / 2 * wg + 2 * c);
#pragma unroll
      for (int jn = 0; jn < kDqFloats / 4; ++jn) {
        float* at = kWriter ? part + tma::f32_tile_step<kKvRows>(x, jn) : mine + 8 * jn;
        *reinterpret_cast<float2*>(at) = make_float2(dq[4 * jn + 2 * hh], dq[4 * jn + 2 * hh + 1]);
      }
    }
    if constexpr (kWriter) {
      DqHandoff::release();
    } else if constexpr (kStaged) {
      wgmma::fence_proxy_async();  // the staging tile is read by the bulk copies
    }
    if constexpr (kDqFirst) {
      wgmma::wait<0>();
      wgmma::fence_operand(dk);
      wgmma::fence_operand(dv);
      released();
    }
    if constexpr (kStatsAfterHandoff) add_statistics();
  }

  // dV = bf16(dVacc); dK = bf16(alpha dKacc), or for pivot and gproj dKacc in
  // FP32 for the fix-up (finish_rows_kernel, finish_keys_kernel; gproj's
  // second pass, bf16_gproj_keys_kernel.cuh). Keys past M are not written.
  __device__ __forceinline__ void write_keys(const float (&dk)[D / 2], const float (&dv)[D / 2]) const {
    const int warp = tid() >> 5, lane = tid() & 31;
    const int wg = warp >> 2, v = warp & 3, g = lane >> 2, c = lane & 3;
    const int64_t key_base = (static_cast<int64_t>(b) * a.hkv + hk) * a.m;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int key = j0 + 64 * wg + 16 * v + g + 8 * hh;
      if (key >= a.m) continue;
      uint16_t* dvo = output_row(a.dv, a.dv_strides, b, hk, key);
      uint16_t* dko = output_row(a.dk, a.dk_strides, b, hk, key);  // kNone
#pragma unroll
      for (int jn = 0; jn < D / 8; ++jn) {
        const int col = 8 * jn + 2 * c;
        *reinterpret_cast<uint32_t*>(dvo + col) = mma::pack_bf16(dv[4 * jn + 2 * hh], dv[4 * jn + 2 * hh + 1]);
        if constexpr (P != Projection::kNone) {
          *reinterpret_cast<float2*>(a.dk_accum + (key_base + key) * D + col) =
              make_float2(dk[4 * jn + 2 * hh], dk[4 * jn + 2 * hh + 1]);
        } else {
          *reinterpret_cast<uint32_t*>(dko + col) =
              mma::pack_bf16(a.scale * dk[4 * jn + 2 * hh], a.scale * dk[4 * jn + 2 * hh + 1]);
        }
      }
    }
  }
};

template <int D, Projection P>
__global__ void __launch_bounds__(kThreads, hopper::kBlocksPerSm) keyouter_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout<D, P>;
  const auto [j0, b, hk] = hopper::key_block(a);
  const RowTiles seen = tiles_seeing_keys(a, j0, kKvKeys, kKvRows);
  const KeyTile<D, P> kt{a, smem, j0, b, hk, seen.first, seen.count};
  const int iters = kt.iterations();

  const KeyHead kh = key_head(a, b, hk);
  hopper::load_rows<kKvKeys, D>(smem + L::kK, kh.k, a.k_strides.row, j0, a.m);
  hopper::load_rows<kKvKeys, D>(smem + L::kV, kh.v, a.v_strides.row, j0, a.m);

  // Loads of iteration `it` into buffer `buf`: Q, dO and the per-row inputs.
  auto stage = [&](int it, int buf) {
    const int i0 = kt.tile_row0(it);
    hopper::load_query_tile<D>(a, b, kt.head_of(it), i0, smem + (buf ? L::kQ1 : L::kQ0), smem + (buf ? L::kG1 : L::kG0),
                               kt.rows_base(), buf);
  };
  if (iters > 0) stage(0, 0);
  mma::cp_async_commit();

  float dk[D / 2], dv[D / 2];
  hopper::zero(dk);
  hopper::zero(dv);
  kt.fill_ones();  // published by the first iteration's barrier

  // One block barrier per iteration (D = 128: two; KeyTile::compute
  // places the second): the barrier that publishes iteration it's loads also
  // orders every use of the previous iteration's buffers before their reuse.
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    // This iteration's loads arrive; every thread is done with iteration it - 1.
    hopper::publish_buffer(false);
    if (it > 0) kt.add_dq_tile(it - 1, kt.tid());
    if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);  // the buffers of iteration it - 1
      mma::cp_async_commit();
    }
    kt.compute(
        it, smem + (buf ? L::kQ1 : L::kQ0), smem + (buf ? L::kG1 : L::kG0), hopper::staged_rows(kt.rows_base(), buf),
        dk, dv, [] { __syncthreads(); }, [] {});
  }
  if (iters > 0) {
    __syncthreads();
    kt.add_dq_tile(iters - 1, kt.tid());
  }
  if (kt.issues_rows()) bulk::wait_all();  // before the block's shared memory goes
  kt.write_keys(dk, dv);
}

}  // namespace gaugewatch::gpu::bf16::keyouter
