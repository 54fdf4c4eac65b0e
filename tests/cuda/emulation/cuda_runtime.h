#pragma once
// CPU emulation of the small part of CUDA that kernels/cuda/fp32_backward*,
// kernels/cuda/bf16_backward* (with bf16_mma_emulation.h for the tensor core
// and ldmatrix instructions) and their tests use: the kernel source compiles as
// host C++ and each CUDA block runs as 256 std::threads with real barriers
// (__syncthreads, __syncthreads_or) and warp shuffles. Device memory is host
// memory. Found before the toolkit's cuda_runtime.h by include order in
// tests/cuda/CMakeLists.txt (target gaugewatch_cuda_emulation_tests only).
//
// What it checks: indexing, tiling, masking, packing, GQA, row subsets,
// workspace use and the FP32 math of the kernels, on machines without a GPU
// (CI). What it does not: data races, memory ordering, occupancy, timing, or
// the device's own expf/division rounding. The GPU run of
// gaugewatch_cuda_tests remains the test of record.

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

// Kernel headers pick their emulated variants (bf16_mma.cuh) with this.
#define GAUGEWATCH_CUDA_EMULATION 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __grid_constant__  // kernel parameters (tensor maps, tma.cuh) are plain values here
#define GAUGEWATCH_DYNAMIC_SMEM(name) float4* name = gaugewatch_emulation::dynamic_smem()
#define GAUGEWATCH_BF16_SMEM(name) uint16_t* name = reinterpret_cast<uint16_t*>(gaugewatch_emulation::dynamic_smem())
#define GAUGEWATCH_WGMMA_TEST_SMEM(name) \
  uint16_t* name = reinterpret_cast<uint16_t*>(gaugewatch_emulation::dynamic_smem())

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(8) uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorNotSupported = 801 };
using cudaStream_t = struct CUstream_emulated*;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
struct cudaDeviceProp {
  int major = 9;
  int minor = 0;
};

// The attributes the launchers read; the emulated device is an H200's
// size (132 SMs, 50 MiB of L2).
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrL2CacheSize = 38 };

const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();

void __syncthreads();
int __syncthreads_or(int predicate);
float __shfl_xor_sync(unsigned mask, float value, int lane_mask);
int __shfl_xor_sync(unsigned mask, int value, int lane_mask);
double __shfl_xor_sync(unsigned mask, double value, int lane_mask);
unsigned long long __shfl_xor_sync(unsigned mask, unsigned long long value, int lane_mask);
int __shfl_sync(unsigned mask, int value, int src_lane);
unsigned __ballot_sync(unsigned mask, int predicate);
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
float __int_as_float(int x);
int __float_as_int(float x);
float __uint_as_float(unsigned x);
int atomicMin(int* address, int value);
int atomicMax(int* address, int value);
float4 atomicAdd(float4* address, float4 value);
float2 atomicAdd(float2* address, float2 value);
float atomicAdd(float* address, float value);
unsigned long long atomicMax(unsigned long long* address, unsigned long long value);
float __fmul_rn(float a, float b);
float __fadd_rn(float a, float b);
float __fsub_rn(float a, float b);
template <class T>
T __ldg(const T* ptr) {
  return *ptr;
}

namespace gaugewatch_emulation {
float4* dynamic_smem();
// Its size in bytes (at least what the launch asked for).
size_t dynamic_smem_bytes();
// Runs `body` as every thread of every block of `grid` (blocks in order).
void run_grid(dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body);
// Per-warp scratch (2 KiB) and a barrier of the calling thread's warp: the
// building blocks of warp-collective instructions (bf16_mma_emulation.h).
void* warp_scratch();
void warp_barrier();
// A barrier of the calling thread's warpgroup (128 threads: bar.sync id, 128),
// for kernels/cuda/wgmma.cuh (wgmma_emulation.h); blocks of whole warpgroups only.
void warpgroup_barrier();
// Named barrier `id` of `count` threads (bar.sync id, count): the first use of
// an id in a block fixes its count (a later use with another count aborts).
void named_barrier(int id, int count);
// Arrival at named barrier `id` without waiting (bar.arrive id, count); the
// barrier completes when `count` threads have arrived or waited.
void named_barrier_arrive(int id, int count);
}  // namespace gaugewatch_emulation
