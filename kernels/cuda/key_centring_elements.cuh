#pragma once
// Element types, 16-byte chunks and cluster primitives of the key centring
// kernels (key_centring_kernels.cuh), each with the CPU
// emulation's counterpart (tests/cuda/key_centring_test.cpp) where the GPU
// uses an instruction the host does not have.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/problem.h"

#ifdef GAUGEWATCH_CUDA_EMULATION
namespace gaugewatch_emulation {
// The emulated cluster of the calling thread's block (tests/cuda/key_centring_test.cpp).
void cluster_sync();
void* cluster_peer_smem(void* local, int rank);
}  // namespace gaugewatch_emulation
#else
#include <cooperative_groups.h>
#endif

namespace gaugewatch::gpu::detail {

// The element types: storage bits, the exact value as a float, a float
// rounded to the type's grid (RNE) as its bits, and (2-byte types) two floats
// rounded and packed into a word.
struct CentringBf16 {
  using Bits = uint16_t;
  static constexpr ElementType kType = ElementType::kBf16;
  __device__ __forceinline__ static float value(uint32_t bits) { return bits_float(bits << 16); }
  __device__ __forceinline__ static uint32_t grid_bits(float x) { return bf16_bits_rne(x); }
  __device__ __forceinline__ static uint32_t grid_bits2(float lo, float hi) { return bf16x2_bits_rne(lo, hi); }
};
struct CentringFp16 {
  using Bits = uint16_t;
  static constexpr ElementType kType = ElementType::kFp16;
  __device__ __forceinline__ static float value(uint32_t bits) {
    return half_bits_to_float(static_cast<uint16_t>(bits));
  }
  __device__ __forceinline__ static uint32_t grid_bits(float x) { return half_bits_rne(x); }
  __device__ __forceinline__ static uint32_t grid_bits2(float lo, float hi) { return half2_bits_rne(lo, hi); }
};
struct CentringFp32 {
  using Bits = uint32_t;
  static constexpr ElementType kType = ElementType::kFp32;
  __device__ __forceinline__ static float value(uint32_t bits) { return bits_float(bits); }
  __device__ __forceinline__ static uint32_t grid_bits(float x) { return float_bits(x); }
};

// A finite float as a double without a conversion instruction (F2F.F64.F32
// runs at a quarter of the FP64 add rate): the float's sign, exponent and
// mantissa fields moved into a double's make x * 2^-896 exactly (normal and
// subnormal x alike: a subnormal float's field lands on the double subnormal
// of the same scaled value, and zeros stay zeros; scaled_double), and the
// multiplication by 2^896 is exact (exact_double). An infinite or NaN x gives
// a finite value here: callers check exponent_field(x) == 0x7f800000 and
// take static_cast<double> then.
__device__ __forceinline__ double scaled_double(float x) {
  const uint32_t f = float_bits(x);
  const uint32_t hi = static_cast<uint32_t>(static_cast<int32_t>(f) >> 3) & 0x8fffffffu;
  const uint32_t lo = f << 29;
  return bits_double((static_cast<uint64_t>(hi) << 32) | lo);
}
__device__ __forceinline__ double exact_double(float x) { return scaled_double(x) * 0x1p896; }
__device__ __forceinline__ uint32_t exponent_field(float x) { return float_bits(x) & 0x7f800000u; }

// 16 bytes of elements (the vector path), or one element in w[0] (the scalar path).
struct alignas(16) CentringChunk {
  uint32_t w[4];
};

template <class E, bool kVec>
__device__ __forceinline__ CentringChunk load_chunk(const void* p) {
  if constexpr (kVec) {
    return *static_cast<const CentringChunk*>(p);
  } else {
    CentringChunk c{};
    c.w[0] = *static_cast<const typename E::Bits*>(p);
    return c;
  }
}

template <class E, bool kVec>
__device__ __forceinline__ void store_chunk(void* p, const CentringChunk& c) {
  if constexpr (kVec) {
    *static_cast<CentringChunk*>(p) = c;
  } else {
    *static_cast<typename E::Bits*>(p) = static_cast<typename E::Bits>(c.w[0]);
  }
}

// Element e of a chunk (or of a 4-byte word: e < 2 for 2-byte types), as its bits.
template <class E>
__device__ __forceinline__ uint32_t word_element(uint32_t word, int e) {
  if constexpr (sizeof(typename E::Bits) == 4) {
    return word;
  } else {
    return (word >> (16 * e)) & 0xffffu;
  }
}
template <class E>
__device__ __forceinline__ uint32_t chunk_element(const CentringChunk& c, int e) {
  if constexpr (sizeof(typename E::Bits) == 4) {
    return c.w[e];
  } else {
    return word_element<E>(c.w[e / 2], e % 2);
  }
}

// The cluster's barrier and its blocks' shared memory (the emulation's
// counterparts: tests/cuda/key_centring_test.cpp).
#ifdef GAUGEWATCH_CUDA_EMULATION
__device__ __forceinline__ void centring_cluster_sync() { gaugewatch_emulation::cluster_sync(); }
template <class T>
__device__ __forceinline__ T* centring_cluster_peer(T* local, int rank) {
  return static_cast<T*>(gaugewatch_emulation::cluster_peer_smem(local, rank));
}
#else
__device__ __forceinline__ void centring_cluster_sync() { cooperative_groups::this_cluster().sync(); }
template <class T>
__device__ __forceinline__ T* centring_cluster_peer(T* local, int rank) {
  return cooperative_groups::this_cluster().map_shared_rank(local, rank);
}
#endif

}  // namespace gaugewatch::gpu::detail
