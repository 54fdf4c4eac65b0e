#pragma once
// Test kernels of kernels/cuda/wgmma.cuh, one block of one warpgroup each, in
// exactly the modes the fused backward uses (wgmma_test_launch.h lists them).
// Every kernel copies its row-major BF16 operands from global memory into
// shared tiles in wgmma.cuh's layout (tile_offset), makes them visible to the
// tensor core (fence_proxy_async, then a barrier), runs its k16 steps and
// writes the FP32 accumulators row-major. The same source runs on the GPU
// (wgmma_test_gpu.cu) and on the CPU emulation (emulation/wgmma_test_launcher.cpp),
// where the descriptors are decoded by the hardware's address rule.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/bf16_mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "tests/cuda/wgmma_test_launch.h"

// The block's dynamic shared memory; the emulation (emulation/cuda_runtime.h)
// supplies its own block storage.
#ifndef GAUGEWATCH_WGMMA_TEST_SMEM
#define GAUGEWATCH_WGMMA_TEST_SMEM(name) extern __shared__ __align__(1024) uint16_t name[]
#endif

namespace gaugewatch::gpu::wgmma_test {

using testing_cuda::wgmma_test::Case;
using testing_cuda::wgmma_test::Operands;
namespace wg = gaugewatch::gpu::wgmma;

inline constexpr int kM = 64;                                // rows of every accumulator
inline constexpr uint32_t kSubTileBytes = 64 * 64 * 2;       // one [64][64] BF16 sub-tile: the MN-major LBO
inline constexpr size_t kAlignSlack = 1024;                  // align_1024 may skip up to this much

// Row-major [R][W] global -> the [R][W] shared tile.
template <int R, int W>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* global) {
  for (int i = static_cast<int>(threadIdx.x); i < R * W; i += wg::kWarpgroupThreads) {
    tile[wg::tile_offset<R>(i / W, i % W)] = global[i];
  }
}

__device__ __forceinline__ uint32_t pair(const uint16_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16);
}

// The rs A operand of the four k16 steps of a row-major [64][64] A in global
// memory (fragment layout in wgmma.cuh; low half = lower k).
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[4][4], const uint16_t* global) {
  const int w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int row = 16 * w + g;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int col = 16 * s + 2 * c;
    a[s][0] = pair(global + row * 64 + col);
    a[s][1] = pair(global + (row + 8) * 64 + col);
    a[s][2] = pair(global + row * 64 + col + 8);
    a[s][3] = pair(global + (row + 8) * 64 + col + 8);
  }
}

// The accumulator (m64 x 2F) to a row-major [64][2F] matrix.
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

// The k16 steps of A[64][K] B[64][K]^T from K-major tiles (both [64][K]):
// step s starts 32 bytes further into the row, one sub-tile every 4 steps.
template <int K>
__device__ __forceinline__ void mma_k_major(float (&d)[32], const uint16_t* sa, const uint16_t* sb) {
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    wg::mma_ss<false, false>(d, wg::desc_k_major(sa + wg::tile_offset<64>(0, 16 * s)),
                             wg::desc_k_major(sb + wg::tile_offset<64>(0, 16 * s)));
  }
}

// The four k16 steps of A B with B a [64 = k][2F] MN-major tile: step s
// starts 16 rows further down.
template <int F>
__device__ __forceinline__ void mma_rs_mn_major(float (&d)[F], const uint32_t (&a)[4][4], const uint16_t* sb) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    wg::mma_rs<true>(d, a[s], wg::desc_mn_major(sb + wg::tile_offset<64>(16 * s, 0), kSubTileBytes));
  }
}

// Waits for the MMAs issued and keeps the accumulator's reads after the wait.
template <int F>
__device__ __forceinline__ void finish(float (&d)[F]) {
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(d);
}

// Shared tiles written by this block's threads -> visible to wgmma.
__device__ __forceinline__ void publish_tiles() {
  wg::fence_proxy_async();
  __syncthreads();
}

template <int K>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    ss_k_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sa = wg::align_1024(raw);
  uint16_t* sb = sa + kM * K;
  load_tile<kM, K>(sa, a);
  load_tile<64, K>(sb, b);
  publish_tiles();
  float d[32] = {};
  wg::fence();
  mma_k_major<K>(d, sa, sb);
  finish(d);
  store_accumulator(c, d);
}

template <int N>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    rs_b_mn_major_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sb = wg::align_1024(raw);
  load_tile<64, N>(sb, b);
  uint32_t af[4][4];
  load_a_fragments(af, a);
  publish_tiles();
  float d[N / 2] = {};
  wg::fence();
  mma_rs_mn_major(d, af, sb);
  finish(d);
  store_accumulator(c, d);
}

template <int N>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    ss_mn_major_kernel(const uint16_t* a_t, const uint16_t* b, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sa = wg::align_1024(raw);  // [64 = k][64 = m]
  uint16_t* sb = sa + 64 * kM;         // [64 = k][N]
  load_tile<64, kM>(sa, a_t);
  load_tile<64, N>(sb, b);
  publish_tiles();
  float d[N / 2] = {};
  wg::fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    wg::mma_ss<true, true>(d, wg::desc_mn_major(sa + wg::tile_offset<64>(16 * s, 0), kSubTileBytes),
                           wg::desc_mn_major(sb + wg::tile_offset<64>(16 * s, 0), kSubTileBytes));
  }
  finish(d);
  store_accumulator(c, d);
}

// The chains' first product: A [64][64], B [64][64] and V [64][N] into
// shared tiles (sv returned; sa, sb, sv, then free space at sv + 64 N),
// S = A B^T (ss, K-major, K = 64) waited for.
template <int N>
__device__ __forceinline__ uint16_t* chain_scores(float (&s)[32], uint16_t* smem, const uint16_t* a,
                                                  const uint16_t* b, const uint16_t* v) {
  uint16_t* sa = smem;
  uint16_t* sb = sa + kM * 64;
  uint16_t* sv = sb + 64 * 64;
  load_tile<kM, 64>(sa, a);
  load_tile<64, 64>(sb, b);
  load_tile<64, N>(sv, v);
  publish_tiles();
  wg::fence();
  mma_k_major<64>(s, sa, sb);
  finish(s);
  return sv;
}

// S = A B^T (ss, K-major, K = 64), then C = bf16(S) V with S's registers as
// the rs A operand: the backward's P -> dV and dS -> dQ/dK pattern.
template <int N>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    chain_kernel(const uint16_t* a, const uint16_t* b, const uint16_t* v, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  float s[32] = {};
  const uint16_t* sv = chain_scores<N>(s, wg::align_1024(raw), a, b, v);
  uint32_t af[4][4];
  wg::accumulator_to_a(af, s);
  float d[N / 2] = {};
  wg::fence();  // af and d were written by ordinary instructions since
  mma_rs_mn_major(d, af, sv);
  finish(d);
  store_accumulator(c, d);
}

// C = A B[:, 64..127]: A [64][K] K-major (step s 32 bytes further into the
// row, a sub-tile every 4 steps), B a [K][128] tile read MN-major from its
// second 64-column block (step s 16 rows further down).
template <int K>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    ss_k_major_a_mn_major_b_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sa = wg::align_1024(raw);  // [64][K]
  uint16_t* sb = sa + kM * K;          // [K][128]
  load_tile<kM, K>(sa, a);
  load_tile<K, 128>(sb, b);
  publish_tiles();
  float d[32] = {};
  wg::fence();
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    wg::mma_ss<false, true>(d, wg::desc_k_major(sa + wg::tile_offset<64>(0, 16 * s)),
                            wg::desc_mn_major(sb + wg::tile_offset<K>(16 * s, 64), K * 64 * 2));
  }
  finish(d);
  store_accumulator(c, d);
}

// C = A B as two m64n32 halves: A [64][K] K-major, B a [K][64] tile read
// MN-major, columns 0..31 from the start of its 128-byte rows and 32..63
// from 64 bytes into them (the warp-specialized key-outer kernel's dQ at
// D = 64, warpgroup wg taking columns 32 wg..); C row-major [64][64].
template <int K>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    ss_n32_halves_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sa = wg::align_1024(raw);  // [64][K]
  uint16_t* sb = sa + kM * K;          // [K][64]
  load_tile<kM, K>(sa, a);
  load_tile<K, 64>(sb, b);
  publish_tiles();
  float half[2][16] = {};
  wg::fence();
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    const uint64_t desc_a = wg::desc_k_major(sa + wg::tile_offset<64>(0, 16 * s));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wg::mma_ss<false, true>(half[h], desc_a,
                              wg::desc_mn_major(sb + wg::tile_offset<64>(16 * s, 32 * h), kSubTileBytes));
    }
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_operand(half[0]);
  wg::fence_operand(half[1]);
  const int w = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, row = 16 * w + lane / 4, col = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float* at = c + row * 64 + 32 * h + 8 * j + col;
      at[0] = half[h][4 * j];
      at[1] = half[h][4 * j + 1];
      at[8 * 64] = half[h][4 * j + 2];
      at[8 * 64 + 1] = half[h][4 * j + 3];
    }
  }
}

// C = A B^T with B [8][K] (m64n8k16), both K-major (B: one 8-row swizzle
// group per 64 columns; step s 32 bytes further into the rows): with B all
// ones, the row sums of A, as pivot's rho in the key-outer kernels.
template <int K>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    ss_n8_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  uint16_t* sa = wg::align_1024(raw);  // [64][K]
  uint16_t* sb = sa + kM * K;          // [8][K]
  load_tile<kM, K>(sa, a);
  load_tile<8, K>(sb, b);
  publish_tiles();
  float d[4] = {};
  wg::fence();
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    wg::mma_ss<false, false>(d, wg::desc_k_major(sa + wg::tile_offset<64>(0, 16 * s)),
                             wg::desc_k_major(sb + wg::tile_offset<8>(0, 16 * s)));
  }
  finish(d);
  store_accumulator(c, d);
}

// S = A B^T (ss, K-major, K = 64) stored to a [64][64] tile by
// store_accumulator_tile (stmatrix), then C = bf16(S)^T V with that tile as
// the MN-major A operand: the key-outer kernels' dV += r^T dO.
template <int N>
__global__ void __launch_bounds__(wg::kWarpgroupThreads, 1)
    stored_tile_kernel(const uint16_t* a, const uint16_t* b, const uint16_t* v, float* c) {
  GAUGEWATCH_WGMMA_TEST_SMEM(raw);
  float s[32] = {};
  uint16_t* sv = chain_scores<N>(s, wg::align_1024(raw), a, b, v);
  uint16_t* ss = sv + 64 * N;  // bf16(S), [64 rows][64 columns]
  wg::store_accumulator_tile(ss, s, (threadIdx.x / 32) % 4, threadIdx.x % 32);
  publish_tiles();
  float d[N / 2] = {};
  wg::fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    wg::mma_ss<true, true>(d, wg::desc_mn_major(ss + wg::tile_offset<64>(16 * k, 0), kSubTileBytes),
                           wg::desc_mn_major(sv + wg::tile_offset<64>(16 * k, 0), kSubTileBytes));
  }
  finish(d);
  store_accumulator(c, d);
}

// Bytes of dynamic shared memory of `tiles` [64][64] sub-tiles.
constexpr size_t smem_bytes(int tiles) { return static_cast<size_t>(tiles) * kSubTileBytes + kAlignSlack; }

// One case on one block of one warpgroup; Launcher::run(kernel, smem bytes,
// args...) launches it and waits (the GPU's <<<>>> or the emulation's grid).
template <class Launcher>
cudaError_t run_case(Case which, int size, const Operands& o) {
  if (size != 64 && size != 128) return cudaErrorInvalidValue;
  const bool wide = size == 128;
  const int tiles = size / 64;  // sub-tiles of an operand [64][size]
  switch (which) {
    case Case::kSsKMajor:
      return wide ? Launcher::run(ss_k_major_kernel<128>, smem_bytes(2 * tiles), o.a, o.b, o.c)
                  : Launcher::run(ss_k_major_kernel<64>, smem_bytes(2 * tiles), o.a, o.b, o.c);
    case Case::kRsBMnMajor:
      return wide ? Launcher::run(rs_b_mn_major_kernel<128>, smem_bytes(tiles), o.a, o.b, o.c)
                  : Launcher::run(rs_b_mn_major_kernel<64>, smem_bytes(tiles), o.a, o.b, o.c);
    case Case::kSsMnMajor:
      return wide ? Launcher::run(ss_mn_major_kernel<128>, smem_bytes(1 + tiles), o.a, o.b, o.c)
                  : Launcher::run(ss_mn_major_kernel<64>, smem_bytes(1 + tiles), o.a, o.b, o.c);
    case Case::kChain:
      return wide ? Launcher::run(chain_kernel<128>, smem_bytes(2 + tiles), o.a, o.b, o.v, o.c)
                  : Launcher::run(chain_kernel<64>, smem_bytes(2 + tiles), o.a, o.b, o.v, o.c);
    case Case::kSsKMajorAMnMajorB:
      return wide ? Launcher::run(ss_k_major_a_mn_major_b_kernel<128>, smem_bytes(3 * tiles), o.a, o.b, o.c)
                  : Launcher::run(ss_k_major_a_mn_major_b_kernel<64>, smem_bytes(3 * tiles), o.a, o.b, o.c);
    case Case::kSsN32Halves:
      return wide ? Launcher::run(ss_n32_halves_kernel<128>, smem_bytes(2 * tiles), o.a, o.b, o.c)
                  : Launcher::run(ss_n32_halves_kernel<64>, smem_bytes(2 * tiles), o.a, o.b, o.c);
    case Case::kSsN8:  // A's sub-tiles and B's [8][size] (at most one more sub-tile's bytes)
      return wide ? Launcher::run(ss_n8_kernel<128>, smem_bytes(tiles + 1), o.a, o.b, o.c)
                  : Launcher::run(ss_n8_kernel<64>, smem_bytes(tiles + 1), o.a, o.b, o.c);
    case Case::kStoredTile:
      return wide ? Launcher::run(stored_tile_kernel<128>, smem_bytes(3 + tiles), o.a, o.b, o.v, o.c)
                  : Launcher::run(stored_tile_kernel<64>, smem_bytes(3 + tiles), o.a, o.b, o.v, o.c);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gaugewatch::gpu::wgmma_test
