// Tests of key centring (kernels/cuda/key_centring.h) against its definition
// computed here in FP64: kbar and the centred keys bit for bit, the shifted
// lse to FP32 rounding, on sink-like keys (offset: centred), random keys
// (auto leaves them), the three policies, FP32 keys at a head dim that does
// not divide the block, strided q, and a padded lse (L > N) with a -inf row.
//
// Build: gaugewatch_cuda_tests (GPU; skips without an sm_90 device) and
// gaugewatch_cuda_centring_emulation_tests (the same kernel source on the CPU
// through tests/cuda/emulation).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/key_centring.h"
#include "kernels/reference/bf16.h"
#include "tests/cuda/device_support.h"
#include "tests/cuda/problem_support.h"

#ifdef GAUGEWATCH_CENTRING_EMULATION
// CPU emulation: this translation unit is the emulated runtime, the real host
// launcher (key_centring.cu, compiled as C++) and the launchers below in place
// of key_centring_launch.cu's <<<>>>.
#include "emulation.cpp"
#include "kernels/cuda/key_centring.cu"
#include "kernels/cuda/key_centring_kernels.cuh"

namespace gaugewatch::gpu::detail {
cudaError_t launch_centring_stats(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t) {
  const dim3 grid(static_cast<unsigned>(args.splits), static_cast<unsigned>(kv_heads_total));
  if (kv_heads_total > 0) gaugewatch_emulation::run_grid(grid, kCentringThreads, 0, [&] { centring_stats_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_centring_apply(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t) {
  const dim3 grid(static_cast<unsigned>(args.splits), static_cast<unsigned>(kv_heads_total));
  if (kv_heads_total > 0) gaugewatch_emulation::run_grid(grid, kCentringThreads, 0, [&] { centring_apply_kernel(args); });
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
  bool fp32 = false;           // FP32 keys (else BF16)
  bool q_row_major = false;    // q as an SDPA (B, N, H, d) view
  int64_t lse_padding = 0;     // L - N
};

struct Centred {
  std::vector<float> k, lse, kbar;
};

// The definition (kernels/cuda/key_centring.h) in FP64 on the host.
Centred expected(const ref::AttentionInputs& in, const std::vector<float>& lse, int64_t lse_len,
                 gpu::CentringPolicy policy, bool fp32) {
  const auto& s = in.shape;
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads;
  auto grid = [fp32](float x) { return fp32 ? x : ref::round_bf16(x); };
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

// Element storage of BF16-valued floats: BF16 bits, or the floats themselves.
std::vector<uint16_t> storage_bf16(const std::vector<float>& x) { return testing_cuda::to_bf16_bits(x); }

void run_case(const CentringCase& c) {
  const ref::AttentionInputs in = testing_cuda::make_inputs(c.problem);
  const auto& s = in.shape;
  const int64_t d = s.head_dim, lse_len = s.q_len + c.lse_padding;
  std::vector<float> lse(static_cast<size_t>(s.batch * s.q_heads * lse_len));
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = 3.0f + 0.01f * static_cast<float>(i % 97);
  if (s.q_len > 2) lse[1] = -INFINITY;  // a row that sees no key
  const Centred want = expected(in, lse, lse_len, c.policy, c.fp32);

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
  DeviceBuffer<uint16_t> q16(c.fp32 ? std::vector<uint16_t>{} : storage_bf16(q_store));
  DeviceBuffer<uint16_t> k16(c.fp32 ? std::vector<uint16_t>{} : storage_bf16(in.k));
  DeviceBuffer<float> q32(c.fp32 ? q_store : std::vector<float>{}), k32(c.fp32 ? in.k : std::vector<float>{});
  const size_t kv = static_cast<size_t>(s.kv_elements()), kbar_count = static_cast<size_t>(s.batch * s.kv_heads * d);
  DeviceBuffer<uint16_t> kc16(c.fp32 ? 0 : kv), kbar16(c.fp32 ? 0 : kbar_count);
  DeviceBuffer<float> kc32(c.fp32 ? kv : 0), kbar32(c.fp32 ? kbar_count : 0);
  DeviceBuffer<float> lse_in(lse), lse_out(lse.size());
  lse_out.poison();

  gpu::KeyCentringParams p;
  p.shape = testing_cuda::problem_shape(in, nullptr, nullptr);
  p.dtype = c.fp32 ? gpu::ElementType::kFp32 : gpu::ElementType::kBf16;
  p.policy = c.policy;
  p.q = c.fp32 ? static_cast<const void*>(q32.get()) : static_cast<const void*>(q16.get());
  p.k = c.fp32 ? static_cast<const void*>(k32.get()) : static_cast<const void*>(k16.get());
  p.lse = lse_in.get();
  p.q_strides = q_strides;
  p.k_strides = gpu::OperandStrides{s.kv_heads * s.kv_len * d, s.kv_len * d, d};
  p.k_centred_strides = p.k_strides;
  p.lse_strides[0] = s.q_heads * lse_len;
  p.lse_strides[1] = lse_len;
  p.lse_strides[2] = 1;
  p.lse_len = lse_len;
  p.k_centred = c.fp32 ? static_cast<void*>(kc32.get()) : static_cast<void*>(kc16.get());
  p.lse_shifted = lse_out.get();
  p.kbar = c.fp32 ? static_cast<void*>(kbar32.get()) : static_cast<void*>(kbar16.get());
  const size_t bytes = gpu::key_centring_workspace_bytes(p);
  DeviceBuffer<unsigned char> workspace(bytes);
  const gpu::Status status = gpu::center_keys(p, workspace.get(), bytes, nullptr);
  ASSERT_TRUE(status.ok()) << c.name << ": " << status.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> got_k = c.fp32 ? kc32.download() : testing_cuda::from_bf16_bits(kc16.download());
  const std::vector<float> got_kbar = c.fp32 ? kbar32.download() : testing_cuda::from_bf16_bits(kbar16.download());
  const std::vector<float> got_lse = lse_out.download();
  int centred = 0;
  for (size_t i = 0; i < want.kbar.size(); ++i) {
    centred += want.kbar[i] != 0.0f ? 1 : 0;
    ASSERT_EQ(got_kbar[i], want.kbar[i]) << c.name << " kbar[" << i << "]";
  }
  for (size_t i = 0; i < want.k.size(); ++i) ASSERT_EQ(got_k[i], want.k[i]) << c.name << " k_centred[" << i << "]";
  double worst = 0.0;
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (!std::isfinite(want.lse[i])) {
      ASSERT_EQ(got_lse[i], want.lse[i]) << c.name << " lse[" << i << "] (not finite: copied)";
      continue;
    }
    const double err = std::fabs(static_cast<double>(got_lse[i]) - want.lse[i]) / (1.0 + std::fabs(lse[i] - want.lse[i]));
    worst = err > worst ? err : worst;
  }
  std::printf("[%s] %d of %zu coordinates centred, lse deviation %.2e\n", c.name.c_str(), centred,
              want.kbar.size(), worst);
  EXPECT_LE(worst, 2e-7) << c.name << " lse_shifted";
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
  CentringCase never = make("never", shape(1, 2, 2, 20, 60, 64), 200.0f);
  never.policy = gpu::CentringPolicy::kNever;
  CentringCase fp32 = make("fp32_d80", shape(1, 3, 1, 25, 200, 80), 30.0f);
  fp32.fp32 = true;
  for (const CentringCase& c : {sink, random, always, never, fp32}) run_case(c);
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
    const Centred want = expected(in, lse, 8, gpu::CentringPolicy::kAuto, false);
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
}

}  // namespace
}  // namespace gaugewatch
