// A race-free kernel for compute-sanitizer's racecheck: two warpgroups write
// their partials of an iteration into shared memory, and after a
// __syncthreads every thread reads both (the key-outer kernel's D = 64 dQ
// exchange, bf16_keyouter_kernel.cuh). Variant 0: nothing else; variant 1:
// the kernel's pingpong besides (warpgroup 0 bar.arrive, warpgroup 1 bar.sync
// on barrier 3); variant 2: that and a per-warpgroup named barrier (1 + wg);
// variants 3 and 4: the partials written by cp.async (16-byte copies from
// global memory, waited for before the next __syncthreads), as the Hopper
// pair's dkdv kernel stages Q, with the pingpong (3) and without it (4).
// Variants 5 and 6: the Hopper pair's dkdv loop (bf16_backward_hopper.cuh)
// around pivot's fix-up: a tile double-buffered by cp.async (iteration it
// issues iteration it + 1's copies into the other buffer, then wait_group 1,
// or 0 in the last iteration, and a __syncthreads), generic reads of the
// current buffer by threads other than the ones that copied it (the
// fix-up's reads of the Q tile), and the iteration's closing
// __syncthreads; 5 with the pingpong after the first barrier (where dkdv
// issues its S and dP MMAs), 6 without. The second argument is the
// iteration count (default 6; racecheck reported the dkdv fix-up on the
// H200 with 8 iterations per block, 2026-12-05).
//   compute-sanitizer --tool racecheck build-device/bin/racecheck_pingpong_probe 1
//   compute-sanitizer --tool racecheck build-device/bin/racecheck_pingpong_probe 5 8
// On the H200 (compute-sanitizer of CUDA 13.0, 2026-12-01): variant 0 reports
// no hazard, variants 1 and 2 report RAW hazards between the write and the
// read across the __syncthreads: racecheck's reports on kernels with a
// bar.arrive are not evidence of a race (kernels/cuda/README.md). Variants 3
// and 4 reported no hazard (2026-12-04): with cp.async writes the pingpong
// alone does not draw a report. Variant 5 with 8 iterations reported 4
// hazards (cp.async write against read), variant 6 none (2026-12-05): the
// pair's pivot fix-up report (kernels/cuda/README.md) is the same artefact.
#include <cstdio>
#include <cstdlib>
__device__ __forceinline__ void copy_async_16(float* dst, const float* src) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
}

__device__ __forceinline__ void commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Variants 5 and 6: thread t < 128 copies 16 bytes (floats 4 t ..) of a
// 512-float tile; every thread then reads 2 floats that a thread of the
// other warpgroup copied.
__device__ float double_buffered(float (&tile)[2][64 * 8], const float* src, bool pingpong, int iters) {
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  auto stage = [&](int it, int buf) {
    if (threadIdx.x < 128) copy_async_16(&tile[buf][4 * t], src + (it % 3) * 64 * 8 + 4 * t);
    commit_group();
  };
  float acc = 0.f;
  stage(0, 0);
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const bool more = it + 1 < iters;
    if (more) stage(it + 1, buf ^ 1);
    if (more) {
      wait_group<1>();
    } else {
      wait_group<0>();
    }
    __syncthreads();
    if (pingpong) {
      if (wg == 1) asm volatile("bar.sync 3, 256;" ::: "memory");
      if (wg == 0) asm volatile("bar.arrive 3, 256;" ::: "memory");
    }
    const int i = (2 * threadIdx.x + 256) % 512;  // copied by thread i / 4 (the other warpgroup's half)
    acc += tile[buf][i] + tile[buf][i + 1];
    __syncthreads();
  }
  return acc;
}

__global__ void probe(float* out, const float* src, int variant, int iters) {
  __shared__ __align__(16) float part[2][2][64 * 8];
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (variant >= 5) {
    out[blockIdx.x * 256 + threadIdx.x] = double_buffered(part[0], src, variant == 5, iters);
    return;
  }
  float acc = 0.f;
  for (int it = 0; it < iters; ++it) {
    __syncthreads();
    if (it > 0) {  // read both warpgroups' partials of iteration it - 1
      const float* set = part[(it - 1) & 1][0];
      for (int i = threadIdx.x; i < 64 * 8; i += 256) acc += set[i] + set[64 * 8 + i];
    }
    if (variant >= 1 && variant <= 3) {
      if (wg == 1) asm volatile("bar.sync 3, 256;" ::: "memory");
      if (wg == 0) asm volatile("bar.arrive 3, 256;" ::: "memory");
    }
    if (variant == 2) asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
    if (variant >= 3) {  // this iteration's partial by cp.async, complete before the next barrier
      for (int i = 4 * t; i < 64 * 8; i += 4 * 128) copy_async_16(&part[it & 1][wg][i], src + i);
      asm volatile("cp.async.wait_all;\n" ::: "memory");
    } else {
      for (int i = t; i < 64 * 8; i += 128) part[it & 1][wg][i] = it + i + wg;  // this iteration's partial
    }
  }
  __syncthreads();
  const float* set = part[(iters - 1) & 1][0];
  for (int i = threadIdx.x; i < 64 * 8; i += 256) acc += set[i] + set[64 * 8 + i];
  out[blockIdx.x * 256 + threadIdx.x] = acc;
}
int main(int argc, char** argv) {
  const int variant = argc > 1 ? atoi(argv[1]) : 0;
  float *out, *src;
  cudaMalloc(&out, 4 * 256 * sizeof(float));
  const int iters = argc > 2 ? atoi(argv[2]) : 6;
  cudaMalloc(&src, 3 * 64 * 8 * sizeof(float));
  cudaMemset(src, 0, 3 * 64 * 8 * sizeof(float));
  probe<<<4, 256>>>(out, src, variant, iters);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("variant %d, %d iterations: %s\n", variant, iters, cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
