// Tests of key centring (kernels/cuda/key_centring.h) against its definition
// computed here in FP64 (coordinates in order): kbar, the centred keys and the
// shifted lse bit for bit, on sink-like keys (offset: centred), random keys
// (auto leaves them), keys with both kinds of coordinates, the three
// policies, GQA, every instantiation (BF16, FP16 and FP32, each on the
// 16-byte path and one element at a time: head dims 36 and 35), head dims 64,
// 80, 128 and 256, clusters of 1, 2, 4 and 8 blocks, key counts that no block
// or cluster size divides, shares of many summation batches (a block's
// 200 KiB share; 16 KiB batches), many keys and lse rows per apply block,
// strided q, a padded lse (L > N) with a
// -inf row and a padded output (L_out > L), infinite and NaN operands.
//
// Build: gaugewatch_cuda_tests (GPU; skips without an sm_90 device) and
// gaugewatch_cuda_centring_emulation_tests (the same kernel source on the CPU
// through tests/cuda/emulation, each cluster's blocks running at once).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/key_centring.h"
#include "kernels/reference/bf16.h"
#include "tests/cuda/device_support.h"
#include "tests/cuda/problem_support.h"

#ifdef GAUGEWATCH_CENTRING_EMULATION
// CPU emulation: this translation unit is the emulated runtime, the real host
// launcher (key_centring.cu, compiled as C++), and below the launcher in place
// of key_centring_launch.cu's two launches: kernel 1's clusters in order, the
// blocks of one cluster at the same time (a barrier across them, and each
// block's shared memory reachable from the others); then kernel 2's blocks in
// order.
#include "emulation.cpp"
#include "kernels/cuda/key_centring.cu"
#include "kernels/cuda/key_centring_kernels.cuh"

namespace gaugewatch_emulation {
namespace {
struct Cluster {
  Cluster(int size, int threads) : barrier(size * threads) {}
  std::barrier<> barrier;
  std::vector<std::unique_ptr<Block>> blocks;
};
thread_local Cluster* current_cluster = nullptr;
}  // namespace

void cluster_sync() { current_cluster->barrier.arrive_and_wait(); }

void* cluster_peer_smem(void* local, int rank) {
  const std::ptrdiff_t offset = static_cast<char*>(local) - reinterpret_cast<char*>(current->smem_base);
  return reinterpret_cast<char*>(current_cluster->blocks[static_cast<size_t>(rank)]->smem_base) + offset;
}
}  // namespace gaugewatch_emulation

namespace gaugewatch::gpu::detail {
cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t) {
  using gaugewatch_emulation::Block;
  using gaugewatch_emulation::Cluster;
  const CentringKernels kernels = centring_kernels_for(args);
  // One host thread per thread of a grid row, stepping through the rows in
  // order, each row with its own blocks (its barriers and shared memory): a
  // thread that finishes a row waits in the next one's barriers for the rest.
  // Kernel 1: a row is a (b, hk)'s cluster, its blocks at once.
  if (args.sums != 0) {
    std::vector<std::unique_ptr<Cluster>> clusters;
    for (int64_t pair = 0; pair < kv_heads_total; ++pair) {
      clusters.push_back(std::make_unique<Cluster>(args.cluster, kCentringSumThreads));
      for (int r = 0; r < args.cluster; ++r) {
        clusters.back()->blocks.push_back(
            std::make_unique<Block>(kCentringSumThreads, static_cast<size_t>(kCentringSumSmemBytes)));
      }
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < args.cluster; ++r) {
      for (int t = 0; t < kCentringSumThreads; ++t) {
        threads.emplace_back([&, r, t] {
          for (int64_t pair = 0; pair < kv_heads_total; ++pair) {
            Cluster& cluster = *clusters[static_cast<size_t>(pair)];
            threadIdx.x = static_cast<unsigned>(t);
            blockIdx.x = static_cast<unsigned>(r);
            blockIdx.y = static_cast<unsigned>(pair);
            gaugewatch_emulation::current = cluster.blocks[static_cast<size_t>(r)].get();
            gaugewatch_emulation::current_cluster = &cluster;
            kernels.sum(args);
          }
        });
      }
    }
    for (auto& thread : threads) thread.join();
  }
  // Kernel 2, after it: a row is one block.
  std::vector<std::unique_ptr<Block>> blocks;
  for (int64_t i = 0; i < kv_heads_total * args.apply_blocks; ++i) {
    blocks.push_back(std::make_unique<Block>(kCentringApplyThreads, static_cast<size_t>(kCentringApplySmemBytes)));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kCentringApplyThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = 0; i < kv_heads_total * args.apply_blocks; ++i) {
        threadIdx.x = static_cast<unsigned>(t);
        blockIdx.x = static_cast<unsigned>(i % args.apply_blocks);
        blockIdx.y = static_cast<unsigned>(i / args.apply_blocks);
        gaugewatch_emulation::current = blocks[static_cast<size_t>(i)].get();
        gaugewatch_emulation::current_cluster = nullptr;
        kernels.apply(args);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return cudaSuccess;
}
}  // namespace gaugewatch::gpu::detail
#endif

namespace gaugewatch {
namespace {

namespace ref = gaugewatch::reference;
using testing_cuda::DeviceBuffer;

struct CentringCase {
  std::string name;
  testing_cuda::KernelCase problem;
  gpu::CentringPolicy policy = gpu::CentringPolicy::kAuto;
  gpu::ElementType dtype = gpu::ElementType::kBf16;  // of q, k, k - kbar and kbar
  bool q_row_major = false;    // q as an SDPA (B, N, H, d) view
  int64_t lse_padding = 0;     // L - N
  int64_t out_padding = 0;     // L_out - L: rows of lse_shifted written 0
  int64_t plain_columns = 0;   // key coordinates [0, plain_columns) without the offset (random keys there)
  int64_t infinite_key = -1;   // index into k of an element set to +inf (none: -1)
  int64_t nan_query = -1;      // index into q of an element set to NaN (none: -1)
};

// FP16 written out here, independently of the kernel's element_bits.cuh: x
// rounded to the nearest FP16 value (ties to even, overflow to inf), and the
// bits of an FP16 value.
float round_half(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return std::copysign(INFINITY, x);
  const int exponent = std::max(std::ilogb(a), -14);  // subnormals share 2^-14's spacing
  const double ulp = std::ldexp(1.0, exponent - 10);
  return static_cast<float>(std::copysign(std::nearbyint(a / ulp) * ulp, static_cast<double>(x)));
}
uint16_t half_bits(float v) {  // v an FP16 value
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(v));
  if (std::isinf(v)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(a * std::ldexp(1.0, 24));
  const int exponent = std::ilogb(a);
  const auto mantissa = static_cast<uint16_t>((a / std::ldexp(1.0, exponent) - 1.0) * 1024.0);
  return sign | static_cast<uint16_t>((exponent + 15) << 10) | mantissa;
}
float half_value(uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  if (exponent == 31) return static_cast<float>(sign * INFINITY);
  if (exponent == 0) return static_cast<float>(sign * std::ldexp(mantissa, -24));
  return static_cast<float>(sign * std::ldexp(1024 + mantissa, exponent - 25));
}

float to_grid(float x, gpu::ElementType dtype) {
  switch (dtype) {
    case gpu::ElementType::kBf16: return ref::round_bf16(x);
    case gpu::ElementType::kFp16: return round_half(x);
    default: return x;
  }
}

// 2-byte storage of grid values (BF16 or FP16 bits), and back.
std::vector<uint16_t> to_bits16(const std::vector<float>& x, gpu::ElementType dtype) {
  if (dtype == gpu::ElementType::kBf16) return testing_cuda::to_bf16_bits(x);
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = half_bits(x[i]);
  return bits;
}
std::vector<float> from_bits16(const std::vector<uint16_t>& bits, gpu::ElementType dtype) {
  if (dtype == gpu::ElementType::kBf16) return testing_cuda::from_bf16_bits(bits);
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) x[i] = half_value(bits[i]);
  return x;
}

struct Centred {
  std::vector<float> k, lse, kbar;
};

// The definition (kernels/cuda/key_centring.h) in FP64 on the host.
Centred expected(const ref::AttentionInputs& in, const std::vector<float>& lse, int64_t lse_len,
                 gpu::CentringPolicy policy, gpu::ElementType dtype) {
  const auto& s = in.shape;
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads;
  auto grid = [dtype](float x) { return to_grid(x, dtype); };
  Centred c;
  c.k = in.k;
  c.lse = lse;
  c.kbar.assign(static_cast<size_t>(s.batch * s.kv_heads * d), 0.0f);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t hk = 0; hk < s.kv_heads; ++hk) {
      const float* k = &in.k[static_cast<size_t>(s.kv_offset(b, hk, 0))];
      float* kbar = &c.kbar[static_cast<size_t>((b * s.kv_heads + hk) * d)];
      for (int64_t col = 0; col < d && policy != gpu::CentringPolicy::kNever && s.kv_len > 0; ++col) {
        double mean = 0.0, var = 0.0;
        for (int64_t j = 0; j < s.kv_len; ++j) mean += k[j * d + col];
        mean /= static_cast<double>(s.kv_len);
        for (int64_t j = 0; j < s.kv_len; ++j) var += (k[j * d + col] - mean) * (k[j * d + col] - mean);
        const double spread = std::sqrt(var / static_cast<double>(s.kv_len));
        if (policy == gpu::CentringPolicy::kAlways || std::fabs(mean) > 2.0 * spread) {
          kbar[col] = grid(static_cast<float>(mean));
        }
      }
      float* kc = &c.k[static_cast<size_t>(s.kv_offset(b, hk, 0))];
      for (int64_t j = 0; j < s.kv_len; ++j) {
        for (int64_t col = 0; col < d; ++col) kc[j * d + col] = grid(kc[j * d + col] - kbar[col]);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i = 0; i < s.q_len; ++i) {
          float& l = c.lse[static_cast<size_t>((b * s.q_heads + h) * lse_len + i)];
          if (!std::isfinite(l)) continue;
          double dot = 0.0;
          for (int64_t col = 0; col < d; ++col) {
            dot += static_cast<double>(in.q[static_cast<size_t>(s.q_offset(b, h, i) + col)]) * kbar[col];
          }
          l = l - static_cast<float>(in.scale) * static_cast<float>(dot);
        }
      }
    }
  }
  return c;
}

void run_case(const CentringCase& c) {
  ref::AttentionInputs in = testing_cuda::make_inputs(c.problem);
  const auto& s = in.shape;
  const int64_t columns = s.head_dim;
  for (size_t i = 0; i < in.k.size(); ++i) {
    if (static_cast<int64_t>(i) % columns < c.plain_columns) in.k[i] = in.v[i];  // v: random, no offset
  }
  if (c.infinite_key >= 0) in.k[static_cast<size_t>(c.infinite_key)] = INFINITY;
  if (c.nan_query >= 0) in.q[static_cast<size_t>(c.nan_query)] = NAN;
  for (auto& x : in.q) x = to_grid(x, c.dtype);
  for (auto& x : in.k) x = to_grid(x, c.dtype);
  const bool fp32 = c.dtype == gpu::ElementType::kFp32;
  const int64_t d = s.head_dim, lse_len = s.q_len + c.lse_padding;
  std::vector<float> lse(static_cast<size_t>(s.batch * s.q_heads * lse_len));
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = 3.0f + 0.01f * static_cast<float>(i % 97);
  if (s.q_len > 2) lse[1] = -INFINITY;  // a row that sees no key
  const Centred want = expected(in, lse, lse_len, c.policy, c.dtype);

  // q as given, or permuted to (B, N, H, d) storage.
  std::vector<float> q_store = in.q;
  gpu::OperandStrides q_strides{s.q_heads * s.q_len * d, s.q_len * d, d};
  if (c.q_row_major) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.q_heads; ++h)
        for (int64_t i = 0; i < s.q_len; ++i)
          for (int64_t col = 0; col < d; ++col)
            q_store[static_cast<size_t>(((b * s.q_len + i) * s.q_heads + h) * d + col)] =
                in.q[static_cast<size_t>(s.q_offset(b, h, i) + col)];
    q_strides = gpu::OperandStrides{s.q_len * s.q_heads * d, d, s.q_heads * d};
  }
  DeviceBuffer<uint16_t> q16(fp32 ? std::vector<uint16_t>{} : to_bits16(q_store, c.dtype));
  DeviceBuffer<uint16_t> k16(fp32 ? std::vector<uint16_t>{} : to_bits16(in.k, c.dtype));
  DeviceBuffer<float> q32(fp32 ? q_store : std::vector<float>{}), k32(fp32 ? in.k : std::vector<float>{});
  const size_t kv = static_cast<size_t>(s.kv_elements()), kbar_count = static_cast<size_t>(s.batch * s.kv_heads * d);
  DeviceBuffer<uint16_t> kc16(fp32 ? 0 : kv), kbar16(fp32 ? 0 : kbar_count);
  DeviceBuffer<float> kc32(fp32 ? kv : 0), kbar32(fp32 ? kbar_count : 0);
  const int64_t out_len = lse_len + c.out_padding;
  DeviceBuffer<float> lse_in(lse), lse_out(static_cast<size_t>(s.batch * s.q_heads * out_len));
  lse_out.poison();

  gpu::KeyCentringParams p;
  p.shape = testing_cuda::problem_shape(in, nullptr, nullptr);
  p.dtype = c.dtype;
  p.policy = c.policy;
  p.q = fp32 ? static_cast<const void*>(q32.get()) : static_cast<const void*>(q16.get());
  p.k = fp32 ? static_cast<const void*>(k32.get()) : static_cast<const void*>(k16.get());
  p.lse = lse_in.get();
  p.q_strides = q_strides;
  p.k_strides = gpu::OperandStrides{s.kv_heads * s.kv_len * d, s.kv_len * d, d};
  p.k_centred_strides = p.k_strides;
  p.lse_strides[0] = s.q_heads * lse_len;
  p.lse_strides[1] = lse_len;
  p.lse_strides[2] = 1;
  p.lse_len = lse_len;
  p.k_centred = fp32 ? static_cast<void*>(kc32.get()) : static_cast<void*>(kc16.get());
  p.lse_shifted = lse_out.get();
  p.lse_shifted_len = c.out_padding > 0 ? out_len : 0;
  p.kbar = fp32 ? static_cast<void*>(kbar32.get()) : static_cast<void*>(kbar16.get());
  const gpu::Status status = gpu::center_keys(p, nullptr);
  ASSERT_TRUE(status.ok()) << c.name << ": " << status.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> got_k = fp32 ? kc32.download() : from_bits16(kc16.download(), c.dtype);
  const std::vector<float> got_kbar = fp32 ? kbar32.download() : from_bits16(kbar16.download(), c.dtype);
  const std::vector<float> got_lse = lse_out.download();
  // Bit for bit; two NaNs match whatever their payloads (the GPU writes its
  // canonical NaN, the host keeps the operand's).
  auto same_bits = [](float x, float y) {
    return std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y));
  };
  int centred = 0;
  for (size_t i = 0; i < want.kbar.size(); ++i) {
    centred += want.kbar[i] != 0.0f ? 1 : 0;
    ASSERT_TRUE(same_bits(got_kbar[i], want.kbar[i])) << c.name << " kbar[" << i << "] " << got_kbar[i] << " "
                                                      << want.kbar[i];
  }
  for (size_t i = 0; i < want.k.size(); ++i) {
    ASSERT_TRUE(same_bits(got_k[i], want.k[i])) << c.name << " k_centred[" << i << "] " << got_k[i] << " "
                                                << want.k[i];
  }
  int shifted = 0;
  for (int64_t row = 0; row < s.batch * s.q_heads; ++row) {
    for (int64_t i = 0; i < out_len; ++i) {
      const float got = got_lse[static_cast<size_t>(row * out_len + i)];
      const float expect = i < lse_len ? want.lse[static_cast<size_t>(row * lse_len + i)] : 0.0f;
      if (i < lse_len) shifted += same_bits(expect, lse[static_cast<size_t>(row * lse_len + i)]) ? 0 : 1;
      ASSERT_TRUE(same_bits(got, expect)) << c.name << " lse_shifted[" << row << ", " << i << "] " << got << " "
                                          << expect;
    }
  }
  std::printf("[%s] %d of %zu coordinates centred, %d lse entries shifted\n", c.name.c_str(), centred,
              want.kbar.size(), shifted);
  if (c.policy == gpu::CentringPolicy::kAlways) {
    EXPECT_EQ(centred, static_cast<int>(want.kbar.size())) << c.name;
  }
  if (c.policy == gpu::CentringPolicy::kNever) {
    EXPECT_EQ(centred, 0) << c.name;
  }
}

CentringCase make(std::string name, ref::AttentionShape sh, float key_offset) {
  CentringCase c;
  c.name = std::move(name);
  c.problem.name = c.name;
  c.problem.shape = sh;
  c.problem.key_offset = key_offset;
  c.problem.seed = 3;
  return c;
}

TEST(KeyCentring, MatchesDefinition) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  CentringCase sink = make("sinklike_auto", shape(2, 4, 2, 70, 300, 64), 200.0f);
  sink.problem.q_gain = 20.0f;
  CentringCase random = make("random_auto", shape(1, 2, 2, 40, 513, 128), 0.0f);
  CentringCase always = make("always_strided_q_padded_lse", shape(1, 4, 1, 33, 90, 64), 50.0f);
  always.policy = gpu::CentringPolicy::kAlways;
  always.q_row_major = true;
  always.lse_padding = 15;
  always.out_padding = 18;
  CentringCase never = make("never", shape(1, 2, 2, 20, 60, 64), 200.0f);
  never.policy = gpu::CentringPolicy::kNever;
  CentringCase fp32 = make("fp32_d80", shape(1, 3, 1, 25, 200, 80), 30.0f);
  fp32.dtype = gpu::ElementType::kFp32;
  for (const CentringCase& c : {sink, random, always, never, fp32}) run_case(c);
}

TEST(KeyCentring, GqaHeadDimsAndOddLengths) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  // GQA 4:1 at d = 128 and 256, 2:1 at d = 36 (72-byte rows: the one-element
  // path); key and query counts no block or cluster size divides.
  CentringCase gqa128 = make("gqa_d128_sinklike", shape(1, 8, 2, 77, 1001, 128), 300.0f);
  gqa128.problem.q_gain = 20.0f;
  CentringCase gqa256 = make("gqa_d256_sinklike", shape(1, 4, 1, 31, 333, 256), 100.0f);
  CentringCase d36 = make("d36_scalar_path", shape(2, 2, 1, 19, 157, 36), 200.0f);
  d36.lse_padding = 13;
  CentringCase random256 = make("random_d256", shape(1, 2, 2, 17, 129, 256), 0.0f);
  // Few keys, many query rows: a small stage, so each block shifts its 400
  // rows in many query tiles.
  CentringCase tiles = make("query_tiles_d256", shape(1, 4, 1, 200, 20, 256), 80.0f);
  tiles.policy = gpu::CentringPolicy::kAlways;
  // At most 16 keys: a cluster of one block.
  CentringCase one_block = make("one_block", shape(1, 2, 1, 30, 10, 64), 100.0f);
  for (const CentringCase& c : {gqa128, gqa256, d36, random256, tiles, one_block}) run_case(c);
}

TEST(KeyCentring, MoreKeysThanABlockStages) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  // FP32, d = 256: 1 KiB rows; one (b, hk) pair takes a cluster of 8, so
  // 2000 keys give each share 250: 15 whole batches of 16 keys and a partial
  // one, each summed in the fixed order (key_centring_args.cuh).
  CentringCase c = make("fp32_d256_ring", shape(1, 2, 1, 9, 2000, 256), 40.0f);
  c.dtype = gpu::ElementType::kFp32;
  c.policy = gpu::CentringPolicy::kAlways;
  // BF16, d = 128: 5600 keys give each share of the 8 700 (175 KiB, 11
  // batches), and the apply blocks many keys each.
  CentringCase full = make("bf16_d128_full_stage", shape(1, 2, 1, 40, 5600, 128), 60.0f);
  for (const CentringCase& x : {c, full}) run_case(x);
}

TEST(KeyCentring, EveryElementTypeAndPath) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  // FP16 on the 16-byte path (d 64) and one element at a time (d 36); FP32
  // one element at a time (d 35: 140-byte rows); BF16 with half its
  // coordinates plain (chunks with and without kbar: q read for some).
  CentringCase fp16 = make("fp16_d64", shape(1, 4, 2, 45, 310, 64), 100.0f);
  fp16.dtype = gpu::ElementType::kFp16;
  fp16.problem.q_gain = 8.0f;
  CentringCase fp16_scalar = make("fp16_d36_scalar", shape(1, 2, 1, 21, 150, 36), 60.0f);
  fp16_scalar.dtype = gpu::ElementType::kFp16;
  fp16_scalar.lse_padding = 5;
  CentringCase fp32_scalar = make("fp32_d35_scalar", shape(1, 2, 2, 17, 140, 35), 50.0f);
  fp32_scalar.dtype = gpu::ElementType::kFp32;
  CentringCase mixed = make("bf16_half_plain", shape(1, 2, 1, 40, 260, 128), 150.0f);
  mixed.plain_columns = 64;
  for (const CentringCase& c : {fp16, fp16_scalar, fp32_scalar, mixed}) run_case(c);
}

TEST(KeyCentring, NonFiniteOperandsAsTheDefinitionTreatsThem) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  // One +inf key (row 100, column 9 of the first head; block 2 of a cluster
  // of 8 holds it, so that block sums again with conversions): its column's
  // mean is inf and its spread NaN, so "auto" leaves it (and the inf passes
  // through k - kbar unchanged); every other column as without it.
  CentringCase c = make("infinite_key", shape(1, 2, 2, 12, 300, 64), 100.0f);
  c.infinite_key = 100 * 64 + 9;
  // And one NaN query (row 5, column 3 of the first head): its row's dot and
  // shifted lse are NaN (a finite stand-in for the NaN would give -inf).
  c.nan_query = 5 * 64 + 3;
  // Policy always on two keys, the second +inf: kbar there is inf (a finite
  // stand-in for the inf would give a finite mean), k - kbar -inf and NaN,
  // and the lse rows shift by -scale q_9 inf.
  CentringCase single = make("infinite_key_always", shape(1, 1, 1, 4, 2, 64), 100.0f);
  single.infinite_key = 64 + 9;
  single.policy = gpu::CentringPolicy::kAlways;
  for (const CentringCase& x : {c, single}) run_case(x);
}

TEST(KeyCentring, ClusterSizes) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  // Clusters of 4 (60 keys: at most 4 blocks of 15+) and of 2 (30 keys), so
  // the cluster's blocks also meet in groups smaller than 8.
  CentringCase four = make("clusters_of_4", shape(1, 2, 1, 6, 60, 64), 100.0f);
  CentringCase two = make("clusters_of_2", shape(1, 2, 2, 5, 30, 64), 100.0f);
  two.policy = gpu::CentringPolicy::kAlways;
  for (const CentringCase& c : {four, two}) run_case(c);
}

TEST(KeyCentring, SinkLikeKeysAreCentredRandomKeysAreNot) {
  SKIP_WITHOUT_GPU();
  using testing_cuda::shape;
  // The offset per coordinate is 200 N(0, 1) against a unit spread: nearly
  // every coordinate is centred; random keys' means are ~1/sqrt(M): none is.
  for (const float offset : {0.0f, 200.0f}) {
    CentringCase c = make(offset == 0.0f ? "random" : "sink", shape(1, 1, 1, 8, 400, 64), offset);
    const ref::AttentionInputs in = testing_cuda::make_inputs(c.problem);
    std::vector<float> lse(8, 1.0f);
    const Centred want = expected(in, lse, 8, gpu::CentringPolicy::kAuto, gpu::ElementType::kBf16);
    int centred = 0;
    for (float x : want.kbar) centred += x != 0.0f ? 1 : 0;
    if (offset == 0.0f) {
      EXPECT_EQ(centred, 0);
    } else {
      EXPECT_GE(centred, 56);
    }
    run_case(c);
  }
}

TEST(KeyCentring, RejectsUnsupportedInputs) {
  gpu::KeyCentringParams p;
  p.shape.head_dim = 300;
  EXPECT_NE(gpu::validate(p).message.find("head_dim 300"), std::string::npos);
  p.shape.head_dim = 64;
  p.shape.q_len = 10;
  p.lse_len = 5;
  EXPECT_NE(gpu::validate(p).message.find("L >= N"), std::string::npos);
  p.lse_len = 12;
  p.lse_shifted_len = 11;
  EXPECT_NE(gpu::validate(p).message.find("L_out >= L"), std::string::npos);
}

}  // namespace
}  // namespace gaugewatch
