// CPU emulation of CUDA blocks for the fp32 backward kernels (see
// cuda_runtime.h beside this file): one std::thread per CUDA thread, blocks
// one after another, and the launch templates of fp32_backward_launch.cuh
// re-expressed as loops over the grid.

#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cuda/fp32_backward_kernel.cuh"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;

namespace gaugewatch_emulation {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpgroup = 128;  // 4 warps: the threads of one wgmma
constexpr size_t kScratchWords = 256;  // 2 KiB per warp
// The alignment the GPU gives the kernels' dynamic shared memory arrays
// (declared __align__(128), GAUGEWATCH_BF16_SMEM): layouts whose slack
// assumes it (gproj_keys_ws::Layout) overrun a less aligned emulated block.
constexpr uintptr_t kSmemAlign = 128;

struct Block {
  explicit Block(int threads, size_t smem_bytes)
      : all(threads),
        shuffle(static_cast<size_t>(threads), 0.0f),
        scratch(static_cast<size_t>(threads / kWarp) * kScratchWords, 0),
        smem(smem_bytes / sizeof(float4) + 1 + kSmemAlign / sizeof(float4)) {
    for (int w = 0; w < threads / kWarp; ++w) warps.push_back(std::make_unique<std::barrier<>>(kWarp));
    // A block that is not whole warpgroups has none (warpgroup_barrier fails).
    if (threads % kWarpgroup == 0) {
      for (int g = 0; g < threads / kWarpgroup; ++g) {
        warpgroups.push_back(std::make_unique<std::barrier<>>(kWarpgroup));
      }
    }
    // Shared memory starts as NaN: a read before a write poisons the result.
    for (auto& v : smem) v = make_float4(NAN, NAN, NAN, NAN);
    const uintptr_t at = reinterpret_cast<uintptr_t>(smem.data());
    smem_base = smem.data() + ((kSmemAlign - at % kSmemAlign) % kSmemAlign) / sizeof(float4);
    smem_bytes_from_base = (smem_bytes / sizeof(float4) + 1) * sizeof(float4);
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<std::unique_ptr<std::barrier<>>> warpgroups;
  std::mutex named_mutex;
  std::map<int, std::pair<int, std::unique_ptr<std::barrier<>>>> named;  // id -> (count, barrier)
  std::vector<float> shuffle;
  std::vector<uint64_t> scratch;  // kScratchWords per warp
  std::atomic<int> any{0};
  std::vector<float4> smem;
  float4* smem_base = nullptr;  // the block's dynamic shared memory: kSmemAlign-aligned, as on the GPU
  size_t smem_bytes_from_base = 0;
};

thread_local Block* current = nullptr;
std::mutex atomic_mutex;

template <class Body>
void run_grid_impl(dim3 grid, int threads, size_t smem_bytes, Body body) {
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block block(threads, smem_bytes);
      std::vector<std::thread> pool;
      pool.reserve(static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&block, &body, t, bx, by] {
          threadIdx.x = static_cast<unsigned>(t);
          blockIdx.x = bx;
          blockIdx.y = by;
          current = &block;
          body();
        });
      }
      for (auto& thread : pool) thread.join();
    }
  }
}

}  // namespace

float4* dynamic_smem() { return current->smem_base; }

size_t dynamic_smem_bytes() { return current->smem_bytes_from_base; }

void run_grid(dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  run_grid_impl(grid, threads, smem_bytes, body);
}

void* warp_scratch() {
  const size_t warp = threadIdx.x / kWarp;
  return current->scratch.data() + warp * kScratchWords;
}

void warp_barrier() { current->warps[threadIdx.x / kWarp]->arrive_and_wait(); }

void warpgroup_barrier() {
  const size_t group = threadIdx.x / kWarpgroup;
  if (group >= current->warpgroups.size()) {
    std::fprintf(stderr, "emulation: warpgroup_barrier in a block of %zu threads (not whole warpgroups of %d)\n",
                 current->shuffle.size(), kWarpgroup);
    std::abort();
  }
  current->warpgroups[group]->arrive_and_wait();
}

namespace {
std::barrier<>& named_barrier_of(int id, int count) {
  std::barrier<>* bar = nullptr;
  {
    const std::lock_guard lock(current->named_mutex);
    auto& entry = current->named[id];
    if (!entry.second) {
      if (count <= 0 || count > static_cast<int>(current->shuffle.size()) || count % kWarp != 0) {
        std::fprintf(stderr, "emulation: named barrier %d of %d threads in a block of %zu\n", id, count,
                     current->shuffle.size());
        std::abort();
      }
      entry = {count, std::make_unique<std::barrier<>>(count)};
    } else if (entry.first != count) {
      std::fprintf(stderr, "emulation: named barrier %d used with %d and %d threads\n", id, entry.first, count);
      std::abort();
    }
    bar = entry.second.get();
  }
  return *bar;
}
}  // namespace

void named_barrier(int id, int count) { named_barrier_of(id, count).arrive_and_wait(); }

void named_barrier_arrive(int id, int count) { static_cast<void>(named_barrier_of(id, count).arrive()); }

}  // namespace gaugewatch_emulation

using gaugewatch_emulation::current;

void __syncthreads() { current->all.arrive_and_wait(); }

int __syncthreads_or(int predicate) {
  current->all.arrive_and_wait();
  if (predicate) current->any = 1;
  current->all.arrive_and_wait();
  const int result = current->any.load();
  current->all.arrive_and_wait();
  if (threadIdx.x == 0) current->any = 0;  // ordered before the next use by its first barrier
  return result;
}

int __shfl_xor_sync(unsigned mask, int value, int lane_mask) {
  return __float_as_int(__shfl_xor_sync(mask, __int_as_float(value), lane_mask));
}

double __shfl_xor_sync(unsigned /*mask*/, double value, int lane_mask) {
  auto* lanes = static_cast<double*>(gaugewatch_emulation::warp_scratch());
  const int lane = static_cast<int>(threadIdx.x % gaugewatch_emulation::kWarp);
  lanes[lane] = value;
  gaugewatch_emulation::warp_barrier();
  const double result = lanes[lane ^ lane_mask];
  gaugewatch_emulation::warp_barrier();
  return result;
}

unsigned long long __shfl_xor_sync(unsigned /*mask*/, unsigned long long value, int lane_mask) {
  auto* lanes = static_cast<unsigned long long*>(gaugewatch_emulation::warp_scratch());
  const int lane = static_cast<int>(threadIdx.x % gaugewatch_emulation::kWarp);
  lanes[lane] = value;
  gaugewatch_emulation::warp_barrier();
  const unsigned long long result = lanes[lane ^ lane_mask];
  gaugewatch_emulation::warp_barrier();
  return result;
}

int __shfl_sync(unsigned /*mask*/, int value, int src_lane) {
  auto* lanes = static_cast<int*>(gaugewatch_emulation::warp_scratch());
  const int lane = static_cast<int>(threadIdx.x % gaugewatch_emulation::kWarp);
  lanes[lane] = value;
  gaugewatch_emulation::warp_barrier();
  const int result = lanes[src_lane % gaugewatch_emulation::kWarp];
  gaugewatch_emulation::warp_barrier();
  return result;
}

unsigned __ballot_sync(unsigned /*mask*/, int predicate) {
  auto* votes = static_cast<uint64_t*>(gaugewatch_emulation::warp_scratch());
  const int lane = static_cast<int>(threadIdx.x % gaugewatch_emulation::kWarp);
  votes[lane] = predicate ? 1 : 0;
  gaugewatch_emulation::warp_barrier();
  unsigned word = 0;
  for (int l = 0; l < gaugewatch_emulation::kWarp; ++l) word |= static_cast<unsigned>(votes[l]) << l;
  gaugewatch_emulation::warp_barrier();
  return word;
}

float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}
float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  const int t = static_cast<int>(threadIdx.x);
  const int warp = t / gaugewatch_emulation::kWarp, lane = t % gaugewatch_emulation::kWarp;
  current->shuffle[static_cast<size_t>(t)] = value;
  current->warps[static_cast<size_t>(warp)]->arrive_and_wait();
  const float result =
      current->shuffle[static_cast<size_t>(warp * gaugewatch_emulation::kWarp + (lane ^ lane_mask))];
  current->warps[static_cast<size_t>(warp)]->arrive_and_wait();
  return result;
}

int atomicMin(int* address, int value) {
  const std::lock_guard lock(gaugewatch_emulation::atomic_mutex);
  const int old = *address;
  if (value < old) *address = value;
  return old;
}

int atomicMax(int* address, int value) {
  const std::lock_guard lock(gaugewatch_emulation::atomic_mutex);
  const int old = *address;
  if (value > old) *address = value;
  return old;
}

float4 atomicAdd(float4* address, float4 value) {
  const std::lock_guard lock(gaugewatch_emulation::atomic_mutex);
  const float4 old = *address;
  address->x += value.x;
  address->y += value.y;
  address->z += value.z;
  address->w += value.w;
  return old;
}

float2 atomicAdd(float2* address, float2 value) {
  const std::lock_guard lock(gaugewatch_emulation::atomic_mutex);
  const float2 old = *address;
  address->x += value.x;
  address->y += value.y;
  return old;
}

float atomicAdd(float* address, float value) {
  const std::lock_guard lock(gaugewatch_emulation::atomic_mutex);
  const float old = *address;
  *address += value;
  return old;
}

unsigned long long atomicMax(unsigned long long* address, unsigned long long value) {
  const std::lock_guard lock(gaugewatch_emulation::atomic_mutex);
  const unsigned long long old = *address;
  if (value > old) *address = value;
  return old;
}

float __fmul_rn(float a, float b) {
  volatile float product = a * b;  // rounded once, never fused
  return product;
}

float __fadd_rn(float a, float b) {
  volatile float sum = a + b;  // rounded once, never fused
  return sum;
}

float __fsub_rn(float a, float b) {
  volatile float difference = a - b;  // rounded once, never fused
  return difference;
}

const char* cudaGetErrorString(cudaError_t error) { return error == cudaSuccess ? "no error" : "emulated error"; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int /*device*/) {
  *prop = cudaDeviceProp{};
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *ptr == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind /*kind*/) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t /*stream*/) {
  return cudaMemset(ptr, value, bytes);
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }

namespace gaugewatch::gpu::detail {

template <int D>
cudaError_t launch_fp32_backward(const Args& args, cudaStream_t /*stream*/) {
  using Cfg = typename TileConfig<D>::type;
  const dim3 row_grid(static_cast<unsigned>((args.num_rows + Cfg::kBr - 1) / Cfg::kBr),
                      static_cast<unsigned>(args.num_slices));
  gaugewatch_emulation::run_grid_impl(row_grid, kThreads, Cfg::kSmemBytes,
                                 [&args] { fp32_backward_rows_kernel<Cfg>(args); });
  const dim3 key_grid(static_cast<unsigned>((args.m + Cfg::kBc - 1) / Cfg::kBc),
                      static_cast<unsigned>(args.batch * args.hkv));
  gaugewatch_emulation::run_grid_impl(key_grid, kThreads, Cfg::kSmemBytes,
                                 [&args] { fp32_backward_dkdv_kernel<Cfg>(args); });
  return cudaSuccess;
}

template <int D>
cudaError_t launch_mean_key(const float* k, float* mu, int64_t heads, int64_t m, cudaStream_t /*stream*/) {
  gaugewatch_emulation::run_grid_impl(dim3(static_cast<unsigned>(heads)), kThreads, 0,
                                 [k, mu, m] { mean_key_kernel<D>(k, mu, m); });
  return cudaSuccess;
}

template cudaError_t launch_fp32_backward<64>(const Args&, cudaStream_t);
template cudaError_t launch_fp32_backward<128>(const Args&, cudaStream_t);
template cudaError_t launch_fp32_backward<256>(const Args&, cudaStream_t);
template cudaError_t launch_mean_key<64>(const float*, float*, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_mean_key<128>(const float*, float*, int64_t, int64_t, cudaStream_t);
template cudaError_t launch_mean_key<256>(const float*, float*, int64_t, int64_t, cudaStream_t);

}  // namespace gaugewatch::gpu::detail
