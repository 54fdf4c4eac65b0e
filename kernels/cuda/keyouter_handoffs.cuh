#pragma once
// What the compute warpgroups of the warp-specialized key-outer kernels hand
// to the writer warp of their producer warpgroup (bf16_keyouter_ws_kernel.cuh,
// bf16_gproj_keys_ws_kernel.cuh): each iteration's FP32 dQ (or -lambda U)
// staging tile (DqHandoff, named barriers) and pivot's or gproj's per-row
// statistics (StatsHandoff, mbarriers). The per-tile code on either side is
// keyouter::KeyTile (bf16_keyouter_kernel.cuh) and gproj_keys' tile.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/bulk_reduce.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/tma.cuh"

namespace gaugewatch::gpu::bf16::keyouter {

using hopper::kKvRows;

// dQacc of `a` as the tensor reductions see it: (B Hq, N, D) FP32, dense
// (host code: the maps of every kernel that adds dQ by tensor reductions).
template <int D>
inline tma::F32Tensor dq_accum_tensor(const Args& a) {
  tma::F32Tensor t;
  t.base = a.dq_accum;
  t.planes = static_cast<uint64_t>(a.batch) * static_cast<uint64_t>(a.hq);
  t.rows = static_cast<uint64_t>(a.n);
  t.cols = D;
  return t;
}

// The hand-over of dQ tiles from the compute warpgroups to the writer warp of
// the warp-specialized kernel (KeyTile with kWriter; the producer
// warpgroup's warp kWriterWarp runs KeyTile::writer_loop), by named barriers
// after ids 1..4 (KeyTile's per-warpgroup barriers, the pingpong, the
// compute barrier), over the one staging tile:
//   kFull       the compute threads bar.arrive once their column halves are
//               stored, the writer bar.sync's on it;
//   kEmpty + wg the writer bar.arrive's once its reductions have read
//               the tile, warpgroup wg bar.sync's on it before storing the
//               next iteration's half.
// Neither side can arrive twice at one barrier before the other has passed
// it: each waits at the other's barrier in between. The pingpong (id 3)
// needs no return barrier: the compute barrier before dQ keeps the two
// warpgroups within one iteration of each other.
// The same hand-over serves gproj's second pass at D = 128 (its -lambda U
// tiles, bf16_gproj_keys_ws_kernel.cuh).
struct DqHandoff {
  static constexpr int kWriterWarp = 1;
  static constexpr int kFull = 5;
  static constexpr int kEmpty = 6;  // + wg
  static constexpr int kFullCount = 2 * wgmma::kWarpgroupThreads + 32;
  static constexpr int kEmptyCount = wgmma::kWarpgroupThreads + 32;

  // Compute side, before warpgroup wg stores iteration it's rows: the
  // writer's reductions have read iteration it - 1's tile.
  __device__ __forceinline__ static void acquire(int it, int wg) {
    if (it > 0) wgmma::named_barrier<kEmptyCount>(kEmpty + wg);
  }
  // Compute side, once this thread's rows of the tile are stored.
  __device__ __forceinline__ static void release() {
    wgmma::fence_proxy_async();  // the tile is read by the bulk copies
    wgmma::named_barrier_arrive<kFullCount>(kFull);
  }
  // The writer's tile (the staging tile in tma::f32_tile_offset's swizzled
  // layout, [64 rows][D]) added to rows i0.. of plane `plane` of the FP32
  // accumulator (B Hq, N, D) that `map` describes: D / 32 tensor reductions
  // by lane 0, which skip the rows past N. On the H200 (five D = 128 shapes,
  // bench/results/bench_bf16_backward-tensor-reduce-h200-2026-12-04.md),
  // against 64 bulk reductions of one row each from a padded tile (what
  // keyouter_kernel's add_dq_tile still does): bf16's kernel 0.89-0.93x its
  // time, pivot's 0.94-0.97x, gproj's first pass 0.98-1.03x; gproj's second
  // pass 0.84-0.86x against one bulk reduction of a dense, bank-conflicted
  // tile.
  template <int D>
  __device__ __forceinline__ static void add_tile(const tma::TensorMap* map, int plane, int i0, const float* staging,
                                                  int lane) {
    if (lane == 0) {
      tma::reduce_rows_tile<kKvRows, D>(map, staging, i0, plane);
      bulk::commit();
    }
  }
  // The writer warp: per iteration wait for the tile (kFull), add it
  // (add_tile(it)), and once the reductions have read it hand it
  // back to both warpgroups (kEmpty + wg) when a later iteration will store
  // it again; then wait for the last reductions (before the block's shared
  // memory goes).
  template <class AddTile>
  __device__ __forceinline__ static void writer_loop(int iters, AddTile&& add_tile) {
    for (int it = 0; it < iters; ++it) {
      wgmma::named_barrier<kFullCount>(kFull);
      add_tile(it);
      bulk::wait_read();
      if (it + 1 < iters) {
        wgmma::named_barrier_arrive<kEmptyCount>(kEmpty);
        wgmma::named_barrier_arrive<kEmptyCount>(kEmpty + 1);
      }
    }
    bulk::wait_all();
  }
};

// Pivot's and gproj's per-row statistics from the compute warpgroups to the
// writer warp of the warp-specialized kernel (KeyTile::kStatsByWriter), in
// kBytes of shared memory (8-byte aligned) that the kernel's layout provides:
// statistic[2][64] (the backend's own, per warpgroup and row; pivot: u64,
// the quad's largest pivot_code; gproj: FP32, the partial row sum of r, m),
// rho[2][64] (FP32 partial row sums of t), then two mbarriers:
//   full   64 arrivals: the lanes c = 0 of both warpgroups (two rows each),
//          after storing iteration it's values; the writer waits parity it & 1;
//   empty  32 arrivals: the writer's lanes, once they have read iteration
//          it's values; the storing lanes wait parity (it & 1) ^ 1 before
//          iteration it's stores (round 0 passes at once, mbarrier.cuh).
//          Only they wait: a lane that neither stores nor arrives could be
//          lapped (empty completing twice while it polls, its parity then
//          looking incomplete again; the CPU emulation hung that way).
// The writer's lane l adds rows l and l + 32: pivot the max of the two codes
// (one atomicMax; 0 = no visible key adds nothing), gproj m_wg0 + m_wg1, and
// rho_wg0 + rho_wg1, each sum in FP32 (one atomicAdd; 0 adds nothing). The
// non-specialized kernel's lanes add their own warpgroup's instead
// (KeyTile::compute). Separate from DqHandoff's named
// barriers: the compute threads stage the statistics before storing the dQ
// tile at D = 128 and after handing it over at D = 64
// (KeyTile::kStatsAfterHandoff), and mbarriers' release/acquire is what
// compute-sanitizer's racecheck follows.
template <Projection P>
struct StatsHandoff {
  using Statistic = std::conditional_t<P == Projection::kPivot, unsigned long long, float>;
  static constexpr size_t kStatisticBytes = 2 * kKvRows * sizeof(Statistic);
  static constexpr size_t kBytes = kStatisticBytes + 2 * kKvRows * 4 + 2 * sizeof(uint64_t);
  static constexpr uint32_t kFullCount = 2 * wgmma::kWarpgroupThreads / 4;
  static constexpr uint32_t kEmptyCount = 32;
  static_assert((kStatisticBytes + 2 * kKvRows * 4) % 8 == 0, "mbarriers are 8-byte aligned");
  unsigned char* base;

  __device__ __forceinline__ Statistic* statistic() const { return reinterpret_cast<Statistic*>(base); }
  __device__ __forceinline__ float* rho() const { return reinterpret_cast<float*>(base + kStatisticBytes); }
  __device__ __forceinline__ uint64_t* full() const {
    return reinterpret_cast<uint64_t*>(base + kStatisticBytes + 2 * kKvRows * 4);
  }
  __device__ __forceinline__ uint64_t* empty() const { return full() + 1; }

  __device__ __forceinline__ void init() const {
    mbarrier::init(full(), kFullCount);
    mbarrier::init(empty(), kEmptyCount);
  }
  // Compute side, called by every thread of warpgroup wg (rows r and r + 8
  // of the tile; `lead`: lane c = 0, which holds the quad's values and
  // stores them).
  __device__ __forceinline__ void stage(int it, int wg, int r, bool lead, const Statistic (&statistic_of)[2], float rho0,
                                        float rho1) const {
    if (lead) {
      mbarrier::wait(empty(), static_cast<uint32_t>(it & 1) ^ 1u);  // the writer read iteration it - 1's
      statistic()[wg * kKvRows + r] = statistic_of[0];
      statistic()[wg * kKvRows + r + 8] = statistic_of[1];
      rho()[wg * kKvRows + r] = rho0;
      rho()[wg * kKvRows + r + 8] = rho1;
      mbarrier::arrive(full());  // release: the four stores
    }
  }
  // Writer side, lane 0..31: iteration it's rows i0.. added to the row
  // arrays of its query head (statistic_rows: pivot_code or gproj's
  // mass_accum; row_factor), rows past n skipped.
  __device__ __forceinline__ void add(int it, int lane, int i0, int n, Statistic* statistic_rows, float* row_factor) const {
    mbarrier::wait(full(), static_cast<uint32_t>(it & 1));
    Statistic f[2];
    float sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = lane + 32 * h;
      const Statistic x = statistic()[r], y = statistic()[kKvRows + r];
      if constexpr (P == Projection::kPivot) {
        f[h] = x > y ? x : y;
      } else {
        f[h] = x + y;
      }
      sum[h] = rho()[r] + rho()[kKvRows + r];
    }
    mbarrier::arrive(empty());  // its values are in registers
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = i0 + lane + 32 * h;
      if (row >= n) continue;
      if constexpr (P == Projection::kPivot) {
        if (f[h] != 0) atomicMax(statistic_rows + row, f[h]);
      } else {
        if (f[h] != 0.0f) atomicAdd(statistic_rows + row, f[h]);
      }
      if (sum[h] != 0.0f) atomicAdd(row_factor + row, sum[h]);
    }
  }
};

}  // namespace gaugewatch::gpu::bf16::keyouter
