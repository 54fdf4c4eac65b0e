#pragma once
// CPU emulation of the small part of CUDA that kernels/cuda/fp32_backward*
// and tests/cuda/fp32_backward_test.cpp use: the kernel source compiles as
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

#include <cmath>
#include <cstddef>
#include <cstdint>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define GAUGEWATCH_DYNAMIC_SMEM(name) float4* name = gaugewatch_emulation::dynamic_smem()

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
using cudaStream_t = struct CUstream_emulated*;
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
struct cudaDeviceProp {
  int major = 9;
  int minor = 0;
};

const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
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
int atomicMin(int* address, int value);
int atomicMax(int* address, int value);
float4 atomicAdd(float4* address, float4 value);
float __fmul_rn(float a, float b);
template <class T>
T __ldg(const T* ptr) {
  return *ptr;
}

namespace gaugewatch_emulation {
float4* dynamic_smem();
}  // namespace gaugewatch_emulation
