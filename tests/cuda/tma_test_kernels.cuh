#pragma once
// Test kernels of kernels/cuda/mbarrier.cuh, tma.cuh (loads and FP32
// reductions) and setmaxnreg.cuh (what
// each computes: tma_test_launch.h). The same source runs on the GPU
// (tma_test_gpu.cu) and on the CPU emulation (emulation/tma_test_launcher.cpp);
// run_* below encode the tensor maps and launch through a Launcher:
// Launcher::run(kernel, threads, smem bytes, args...) launches one block and
// waits, returning "" or what failed.
//
// Shared memory of every kernel: 64 x 64 BF16 sub-tiles from the 1024-byte
// aligned base (wgmma::align_1024), then the mbarriers.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/bf16_mma.cuh"
#include "kernels/cuda/bulk_reduce.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/setmaxnreg.cuh"
#include "kernels/cuda/tma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "tests/cuda/tma_test_launch.h"

#ifndef GAUGEWATCH_WGMMA_TEST_SMEM
#define GAUGEWATCH_WGMMA_TEST_SMEM(name) extern __shared__ __align__(1024) uint16_t name[]
#endif

namespace gaugewatch::gpu::tma_test {

using testing_cuda::tma_test::kPhaseSteps;
using testing_cuda::tma_test::F32Tensor;
using testing_cuda::tma_test::Load;
using testing_cuda::tma_test::Tensor;
namespace wg = gaugewatch::gpu::wgmma;
namespace mbar = gaugewatch::gpu::mbarrier;

inline constexpr int kBox = 64;                                        // box 64 x 64: one sub-tile
inline constexpr int kSubTile = kBox * kBox;                           // elements
inline constexpr uint32_t kSubTileBytes = tma::tile_bytes<kBox, kBox>();
inline constexpr size_t kAlignSlack = 1024;

// Bytes of `tiles` sub-tiles and `barriers` mbarriers after the alignment slack.
constexpr size_t smem_bytes(int tiles, int barriers) {
  return kAlignSlack + static_cast<size_t>(tiles) * kSubTileBytes + static_cast<size_t>(barriers) * sizeof(uint64_t);
}

// One thread walks one barrier (count 2) through two phases; out[step] =
// try_wait's answer (1 = complete) after each step (tma_test.cpp expects
// 1 0 0 0 1 0 0 1).
__global__ void __launch_bounds__(32, 1) phase_kernel(const __grid_constant__ tma::TensorMap map, uint32_t* out) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* tile = wg::align_1024(raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(tile + kSubTile);
  if (threadIdx.x != 0) return;
  mbar::init(bar, 2);
  mbar::fence_init();
  out[0] = mbar::try_wait(bar, 1);  // the phase before phase 0 counts as complete
  out[1] = mbar::try_wait(bar, 0);  // phase 0: 2 arrivals pending
  mbar::arrive(bar);
  out[2] = mbar::try_wait(bar, 0);  // 1 pending
  mbar::arrive_expect_tx(bar, kSubTileBytes);
  out[3] = mbar::try_wait(bar, 0);  // 0 pending, tx-count 8192: no copy issued yet
  tma::load_2d(tile, &map, 0, 0, bar);
  mbar::wait(bar, 0);
  out[4] = mbar::try_wait(bar, 0);  // the copy's complete_tx ended phase 0
  out[5] = mbar::try_wait(bar, 1);  // phase 1 is current
  tma::load_2d(tile, &map, 0, 0, bar);  // complete_tx may land before the expect_tx
  mbar::arrive(bar);
  out[6] = mbar::try_wait(bar, 1);  // 1 arrival pending whatever the copy did
  mbar::arrive_expect_tx(bar, kSubTileBytes);
  mbar::wait(bar, 1);
  out[7] = mbar::try_wait(bar, 1);
  mbar::inval(bar);
}

// The producer-consumer ring (tma_test_launch.h): warpgroup 0 produces (one
// thread issues), warpgroups 1 and 2 consume. full[s]: 1 arrival (the
// producer's arrive_expect_tx) + the box's bytes; empty[s]: one arrival per
// consumer thread once it has read the stage.
inline constexpr int kStages = 2;
inline constexpr int kRingThreads = 3 * wg::kWarpgroupThreads;
inline constexpr int kConsumerThreads = 2 * wg::kWarpgroupThreads;

struct RingArgs {
  int origin_row, origin_col, tiles_r, tiles_c;
  uint16_t* out;  // [tiles_r * tiles_c][64][64]
};

__global__ void __launch_bounds__(kRingThreads, 1) ring_kernel(const __grid_constant__ tma::TensorMap map, RingArgs args) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* stages = wg::align_1024(raw);  // [kStages][64][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kSubTile);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar::init(&full[s], 1);
      mbar::init(&empty[s], kConsumerThreads);
    }
    mbar::fence_init();
  }
  __syncthreads();
  const int count = args.tiles_r * args.tiles_c;
  if (threadIdx.x < wg::kWarpgroupThreads) {
    regs::setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      tma::prefetch(&map);
      for (int t = 0; t < count; ++t) {
        const int s = t % kStages;
        const uint32_t round = static_cast<uint32_t>(t / kStages);
        mbar::wait(&empty[s], (round & 1u) ^ 1u);  // consumers have released the stage's last use
        mbar::arrive_expect_tx(&full[s], kSubTileBytes);
        tma::load_2d(stages + s * kSubTile, &map, args.origin_col + kBox * (t % args.tiles_c),
                     args.origin_row + kBox * (t / args.tiles_c), &full[s]);
      }
    }
  } else {
    regs::setmaxnreg_inc<240>();
    const int c = static_cast<int>(threadIdx.x) - wg::kWarpgroupThreads;
    for (int t = 0; t < count; ++t) {
      const int s = t % kStages;
      const uint32_t round = static_cast<uint32_t>(t / kStages);
      mbar::wait(&full[s], round & 1u);
      const uint16_t* tile = stages + s * kSubTile;
      uint16_t* dst = args.out + static_cast<size_t>(t) * kSubTile;
      for (int i = c; i < kSubTile; i += kConsumerThreads) dst[i] = tile[wg::tile_offset<kBox>(i / kBox, i % kBox)];
      mbar::arrive(&empty[s]);
    }
  }
}

// The wgmma kernel (tma_test_launch.h). Sub-tiles: A [64][128] (2), B
// [64][128] (2), V [64][64] (1).
struct WgmmaArgs {
  Tensor a, b, v;  // the cp.async path's operands
  float* s;
  float* c;
};

// cp.async of a [R][W] tile from a strided tensor into wgmma.cuh's layout,
// one 16-byte chunk per copy (chunk_offset), as the backward's kernels load.
template <int R, int W>
__device__ __forceinline__ void cp_async_tile(uint16_t* dst, const Tensor& src) {
  constexpr int kChunks = W / 8;
  for (int i = static_cast<int>(threadIdx.x); i < R * kChunks; i += wg::kWarpgroupThreads) {
    const int row = i / kChunks, chunk = i % kChunks;
    mma::cp_async_16(dst + wg::chunk_offset<R>(row, chunk), src.data + static_cast<size_t>(row) * src.row_stride + 8 * chunk,
                     true);
  }
}

template <int F>
__device__ __forceinline__ void store_accumulator(float* out, const float (&d)[F]) {
  constexpr int kN = 2 * F;
  const int w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int row = 16 * w + g;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const int col = 8 * j + 2 * c;
    out[row * kN + col] = d[4 * j];
    out[row * kN + col + 1] = d[4 * j + 1];
    out[(row + 8) * kN + col] = d[4 * j + 2];
    out[(row + 8) * kN + col + 1] = d[4 * j + 3];
  }
}

template <bool kTma>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    wgmma_kernel(const __grid_constant__ tma::TensorMap map_a, const __grid_constant__ tma::TensorMap map_b,
                 const __grid_constant__ tma::TensorMap map_v, WgmmaArgs args) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sa = wg::align_1024(raw);  // [64][128]
  uint16_t* sb = sa + 2 * kSubTile;    // [64][128]
  uint16_t* sv = sb + 2 * kSubTile;    // [64][64]
  uint64_t* bar = reinterpret_cast<uint64_t*>(sv + kSubTile);
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      mbar::init(bar, 1);
      mbar::fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      mbar::arrive_expect_tx(bar, 2 * tma::tile_bytes<64, 128>() + tma::tile_bytes<64, 64>());
      tma::load_tile<64, 128>(sa, &map_a, 0, 0, bar);
      tma::load_tile<64, 128>(sb, &map_b, 0, 0, bar);
      tma::load_tile<64, 64>(sv, &map_v, 0, 0, bar);
    }
    mbar::wait(bar, 0);  // the copies' bytes are visible to this thread and to the tensor cores
  } else {
    cp_async_tile<64, 128>(sa, args.a);
    cp_async_tile<64, 128>(sb, args.b);
    cp_async_tile<64, 64>(sv, args.v);
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();
  }
  float s[32] = {};
  float c[32] = {};
  // Both accumulators in registers of their own before the first MMA (the
  // compiler would otherwise build c's zeros from s's registers while S's
  // MMAs are in flight, and ptxas would have to wait for them).
  wg::fence_operand(s);
  wg::fence_operand(c);
  wg::fence();
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // S = A B^T: step k 32 bytes further into the row, a sub-tile every 4
    wg::mma_ss<false, false>(s, wg::desc_k_major(sa + wg::tile_offset<64>(0, 16 * k)),
                             wg::desc_k_major(sb + wg::tile_offset<64>(0, 16 * k)));
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // C = A0^T V: step k 16 rows further down
    wg::mma_ss<true, true>(c, wg::desc_mn_major(sa + wg::tile_offset<64>(16 * k, 0), kSubTileBytes),
                           wg::desc_mn_major(sv + wg::tile_offset<64>(16 * k, 0), kSubTileBytes));
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(s);
  wg::fence_operand(c);
  store_accumulator(args.s, s);
  store_accumulator(args.c, c);
}

// The reduction test (tma_test_launch.h, run_reduce): one warpgroup.
struct ReduceArgs {
  const float* tile;  // dense [64][64]
  int row, plane, times;
};

__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    reduce_kernel(const __grid_constant__ tma::TensorMap map, ReduceArgs args) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  float* staging = reinterpret_cast<float*>(wg::align_1024(raw));  // [64][64] FP32, two boxes
  for (int i = static_cast<int>(threadIdx.x); i < kBox * kBox; i += wg::kWarpgroupThreads) {
    staging[tma::f32_tile_offset<kBox>(i / kBox, i % kBox)] = args.tile[i];
  }
  wg::fence_proxy_async();  // the copy engine reads what these stores wrote
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 0; k < args.times; ++k) {
      tma::reduce_rows_tile<kBox, kBox>(&map, staging, args.row, args.plane);
      bulk::commit();
    }
    bulk::wait_all();
  }
}

inline std::string encode(tma::TensorMap* map, const Tensor& t, uint32_t box_rows, const char* name,
                          uint32_t box_cols = tma::kBoxCols) {
  // Negative extents become huge and are refused.
  const tma::EncodeStatus status = tma::encode_bf16_tile_map(
      map, t.data, static_cast<uint64_t>(t.rows), static_cast<uint64_t>(t.cols), static_cast<uint64_t>(t.row_stride),
      box_rows, box_cols);
  return status == tma::EncodeStatus::kOk ? "" : std::string("tensor map of ") + name + ": " + tma::describe(status);
}

inline std::string encode_check(const Tensor& t, int box_rows, int box_cols) {
  tma::TensorMap map{};
  return encode(&map, t, static_cast<uint32_t>(box_rows), "t", static_cast<uint32_t>(box_cols));
}

inline std::string encode_f32(tma::TensorMap* map, const F32Tensor& t, uint32_t box_rows) {
  tma::F32Tensor f;
  f.base = t.data;
  f.planes = static_cast<uint64_t>(t.planes);  // negative extents become huge and are refused
  f.rows = static_cast<uint64_t>(t.rows);
  f.cols = static_cast<uint64_t>(t.cols);
  const tma::EncodeStatus status = tma::encode_f32_reduce_map(map, f, box_rows);
  return status == tma::EncodeStatus::kOk ? "" : std::string("FP32 tensor map: ") + tma::describe(status);
}

inline std::string encode_f32_check(const F32Tensor& t, int box_rows) {
  tma::TensorMap map{};
  return encode_f32(&map, t, static_cast<uint32_t>(box_rows));
}

template <class Launcher>
std::string run_reduce(const float* tile, const F32Tensor& dst, int row, int plane, int times) {
  tma::TensorMap map{};
  std::string error = encode_f32(&map, dst, kBox);
  if (!error.empty()) return error;
  return Launcher::run(reduce_kernel, wg::kWarpgroupThreads, kAlignSlack + kBox * kBox * sizeof(float), map,
                       ReduceArgs{tile, row, plane, times});
}

template <class Launcher>
std::string run_phases(const Tensor& in, uint32_t* out) {
  tma::TensorMap map{};
  std::string error = encode(&map, in, kBox, "in");
  if (!error.empty()) return error;
  return Launcher::run(phase_kernel, 32, smem_bytes(1, 1), map, out);
}

template <class Launcher>
std::string run_ring(const Tensor& in, int origin_row, int origin_col, int tiles_r, int tiles_c, uint16_t* out) {
  tma::TensorMap map{};
  std::string error = encode(&map, in, kBox, "in");
  if (!error.empty()) return error;
  const RingArgs args{origin_row, origin_col, tiles_r, tiles_c, out};
  return Launcher::run(ring_kernel, kRingThreads, smem_bytes(kStages, 2 * kStages), map, args);
}

template <class Launcher>
std::string run_wgmma(Load load, const Tensor& a, const Tensor& b, const Tensor& v, float* s, float* c) {
  tma::TensorMap map_a{}, map_b{}, map_v{};
  const WgmmaArgs args{a, b, v, s, c};
  const size_t smem = smem_bytes(5, 1);
  if (load == Load::kCpAsync) {
    return Launcher::run(wgmma_kernel<false>, wg::kWarpgroupThreads, smem, map_a, map_b, map_v, args);
  }
  std::string error = encode(&map_a, a, kBox, "a");
  if (error.empty()) error = encode(&map_b, b, kBox, "b");
  if (error.empty()) error = encode(&map_v, v, kBox, "v");
  if (!error.empty()) return error;
  return Launcher::run(wgmma_kernel<true>, wg::kWarpgroupThreads, smem, map_a, map_b, map_v, args);
}

}  // namespace gaugewatch::gpu::tma_test
