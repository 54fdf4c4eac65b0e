#pragma once
// Pivot's choice of key per query row on the key-outer path (math:
// bf16_backward.h): pivot_code orders (P, j) as "largest P, then lowest
// key" in one 64-bit integer, so that the key blocks' candidates combine by
// atomicMax in any order; PivotArgmax forms a thread's candidates over its
// elements of an m64n64 score tile, quad_max combines a row's four lanes.
// Used by keyouter::KeyTile (bf16_keyouter_kernel.cuh) and the finish
// kernels (bf16_keyouter_finish_kernels.cuh: pivot_of).

#include <cuda_runtime.h>

#include <cstdint>

namespace gaugewatch::gpu::bf16::keyouter {

// (P, j) as one 64-bit value whose unsigned order is "larger P, then lower
// j": P >= 0, so its FP32 bits order like P. 0 means "no visible key" (a
// visible key's low word ~j is never 0 for j < 2^32 - 1).
__device__ __forceinline__ unsigned long long pivot_code(float p, int j) {
  return (static_cast<unsigned long long>(static_cast<uint32_t>(__float_as_int(p))) << 32) |
         static_cast<unsigned long long>(0xffffffffu - static_cast<uint32_t>(j));
}

__device__ __forceinline__ int pivot_of(unsigned long long code) {
  return code == 0 ? -1 : static_cast<int>(0xffffffffu - static_cast<uint32_t>(code & 0xffffffffull));
}

// Pivot's argmax over one thread's elements of an m64n64 score tile (two
// rows of 16 keys each; wgmma.cuh's fragment layout), two instructions per
// element: an element's code is (bits of P) * 4 + (3 - its place in its group
// of four consecutive keys), one integer max per group (P in [0, 1] has its
// top two bits clear, so the code is exact in 32 bits: the largest P, then
// the lowest key); four groups per row are compared once per row (ties to
// the lower group). P = 0 (masked, or underflowed) is no candidate: a row
// with a visible key has a largest P of at least 1 / M somewhere. This is
// RowStats' argmax (largest P, ties to the lower key) without its compare,
// select and select per element.
struct PivotArgmax {
  uint32_t best[2][4] = {};  // [row half][group of 4 keys]

  // Element i (0..31, a constant after unrolling) of row half hh.
  __device__ __forceinline__ void add(int hh, int i, float p) {
    const uint32_t place = 2 * ((i >> 2) & 1) + (i & 1);  // 0..3: keys 8 (i >> 2) + (i & 1) in order
    const uint32_t code = (static_cast<uint32_t>(__float_as_int(p)) << 2) + (3u - place);
    best[hh][i >> 3] = best[hh][i >> 3] > code ? best[hh][i >> 3] : code;
  }

  // Row half hh's candidate as pivot_code() of its largest P and that key,
  // or 0 where no element has P > 0, for a thread whose group gi, place p
  // is key key0 + 16 gi + 8 (p >> 1) + (p & 1) (key0 = j_base + 2 c; the
  // place enters best as q = 3 - p, so the key is key0 + 16 gi + 9 -
  // (8 (q >> 1) + (q & 1))). A group's keys all lie below the next group's,
  // so the groups are compared on their P bits alone, a later group winning
  // only with a strictly larger P (the largest P, then the lowest key), and
  // the key is formed once, for the winner (40 instructions fewer per
  // iteration than forming and comparing four 64-bit codes; on the H200 the
  // pivot kernel took 0.987x its time at d64, 2026-12-04).
  __device__ __forceinline__ unsigned long long code(int hh, int key0) const {
    uint32_t top = best[hh][0];
    int group = 0;
#pragma unroll
    for (int gi = 1; gi < 4; ++gi) {
      const uint32_t x = best[hh][gi];
      const bool larger = x > (top | 3u);  // (x >> 2) > (top >> 2)
      top = larger ? x : top;
      group = larger ? gi : group;
    }
    const uint32_t q = top & 3u;
    const uint32_t key = static_cast<uint32_t>(key0 + 16 * group + 9) - ((q & 1u) | ((q & 2u) << 2));
    return (top >> 2) == 0 ? 0ull : (static_cast<unsigned long long>(top >> 2) << 32) | (0xffffffffu - key);
  }
};

// The largest of the 4 lanes' codes of each row (pivot_code() order).
__device__ __forceinline__ unsigned long long quad_max(unsigned long long x) {
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    const unsigned long long y = __shfl_xor_sync(0xffffffffu, x, off);
    x = y > x ? y : x;
  }
  return x;
}

}  // namespace gaugewatch::gpu::bf16::keyouter
