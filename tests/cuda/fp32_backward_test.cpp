// GPU tests of the fused FP32 attention backward (kernels/cuda/fp32_backward.h)
// against the CPU reference: backward_fp32 (same math, same key centering) and
// attention_fp64 (ground truth). Every case poisons the outputs and the
// workspace with NaN first, so an element the kernel forgets to write, or a
// workspace value read before it is written, fails the comparison.
//
// Build: target gaugewatch_cuda_tests (tests/cuda/CMakeLists.txt).
// Run:   build/bin/gaugewatch_cuda_tests          (needs an sm_90 GPU; without one
//        every test is skipped with the reason)
//        Each case prints its relative errors (vs backward_fp32 and attention_fp64).

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/fp32_backward.h"
#include "tests/cuda/device_support.h"
#include "tests/cuda/problem_support.h"
#include "kernels/reference/attention_problem.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fp32_backward.h"

namespace gaugewatch {
namespace {

namespace ref = gaugewatch::reference;

using testing_cuda::DeviceBuffer;
using testing_cuda::shape;
using testing_cuda::to_int32;

// A problem (tests/cuda/problem_support.h) and how the kernel runs it.
struct Case : testing_cuda::KernelCase {
  bool center_keys = true;
  bool deterministic = false;
};

using testing_cuda::make_inputs;

struct GpuResult {
  gpu::Status status;
  ref::Gradients grads;
};

// An attn_mask on the host: kind, element strides along (B, Hq, N, M) (0:
// broadcast) and the elements (bool masks as 0/1 floats).
struct HostMask {
  gpu::MaskKind kind = gpu::MaskKind::kNone;
  int64_t strides[4] = {0, 0, 0, 0};
  std::vector<float> values;
  int64_t offset(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3];
  }
};

// Runs the kernel; `slices`/`rows` empty means the full mode.
GpuResult run_gpu(const ref::AttentionInputs& in, bool center_keys, bool deterministic,
                  const std::vector<int32_t>& slices = {}, const std::vector<int32_t>& rows = {},
                  const HostMask& mask = {}) {
  const ref::AttentionShape& sh = in.shape;
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), dout(in.grad_out);
  const bool subset = !slices.empty() || !rows.empty();
  const size_t dq_count = subset ? slices.size() * rows.size() * static_cast<size_t>(sh.head_dim)
                                 : static_cast<size_t>(sh.q_elements());
  DeviceBuffer<float> dq(dq_count), dk(static_cast<size_t>(sh.kv_elements())), dv(static_cast<size_t>(sh.kv_elements()));
  dq.poison();
  dk.poison();
  dv.poison();
  DeviceBuffer<int32_t> cu_q(to_int32(in.cu_seqlens_q)), cu_k(to_int32(in.cu_seqlens_k));
  DeviceBuffer<int32_t> slices_d(slices), rows_d(rows);
  std::vector<uint8_t> flags;
  for (float x : mask.values) flags.push_back(x != 0.0f ? 1 : 0);
  DeviceBuffer<uint8_t> mask_flags(mask.kind == gpu::MaskKind::kBool ? flags : std::vector<uint8_t>{});
  DeviceBuffer<float> mask_bias(mask.kind == gpu::MaskKind::kBias ? mask.values : std::vector<float>{});

  gpu::Fp32BackwardParams p;
  p.q = q.get();
  p.k = k.get();
  p.v = v.get();
  p.grad_out = dout.get();
  p.dq = dq.get();
  p.dk = dk.get();
  p.dv = dv.get();
  p.shape = testing_cuda::problem_shape(in, cu_q.get(), cu_k.get());
  if (mask.kind != gpu::MaskKind::kNone) {
    p.shape.mask.kind = mask.kind;
    p.shape.mask.data = mask.kind == gpu::MaskKind::kBool ? static_cast<const void*>(mask_flags.get())
                                                          : static_cast<const void*>(mask_bias.get());
    for (int i = 0; i < 4; ++i) p.shape.mask.strides[i] = mask.strides[i];
  }
  if (subset) {
    p.slices = slices_d.get();
    p.num_slices = static_cast<int64_t>(slices.size());
    p.rows = rows_d.get();
    p.num_rows = static_cast<int64_t>(rows.size());
  }
  p.center_keys = center_keys;
  p.deterministic = deterministic;

  GpuResult result;
  const size_t ws_bytes = gpu::fp32_backward_workspace_bytes(p);
  DeviceBuffer<unsigned char> workspace(ws_bytes);
  // The workspace as a caching allocator hands it over, not zeroed: NaN in
  // every float, so a row statistic or mean key read before the library
  // writes it, or accumulated into, fails the comparison. (A finite poison
  // would not do for the mean key: centring on any vector is exact in exact
  // arithmetic, so a mean key off by a constant passes within FP32's bound.)
  workspace.poison();
  result.status = gpu::fp32_attention_backward(p, workspace.get(), ws_bytes, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  if (result.status.ok() && sync != cudaSuccess) {
    result.status = gpu::Status{sync, std::string("kernel failed: ") + cudaGetErrorString(sync)};
  }
  result.grads.dq = dq.download();
  result.grads.dk = dk.download();
  result.grads.dv = dv.download();
  return result;
}

std::vector<double> to_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

constexpr double kFp32Tolerance = 1e-5;

std::string describe(const ref::AttentionInputs& in) {
  const auto& s = in.shape;
  return "B=" + std::to_string(s.batch) + " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " N=" + std::to_string(s.q_len) + " M=" + std::to_string(s.kv_len) + " d=" + std::to_string(s.head_dim) +
         " causal=" + std::string(ref::to_string(in.causal)) + (in.packed() ? " packed" : "");
}

class Fp32BackwardCase : public ::testing::TestWithParam<Case> {};

TEST_P(Fp32BackwardCase, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const ref::AttentionInputs in = make_inputs(c);
  const ref::Gradients want = ref::backward_fp32(in, ref::Fp32BackwardOptions{c.center_keys});
  const ref::ExactAttention exact = ref::attention_fp64(in);
  const GpuResult got = run_gpu(in, c.center_keys, c.deterministic);
  ASSERT_TRUE(got.status.ok()) << describe(in) << ": " << got.status.message;

  const double dq32 = ref::relative_error(got.grads.dq, want.dq);
  const double dk32 = ref::relative_error(got.grads.dk, want.dk);
  const double dv32 = ref::relative_error(got.grads.dv, want.dv);
  const double dq64 = ref::relative_error(got.grads.dq, exact.dq);
  const double dk64 = ref::relative_error(got.grads.dk, exact.dk);
  const double dv64 = ref::relative_error(got.grads.dv, exact.dv);
  const double ref_dq64 = ref::relative_error(to_double(want.dq), exact.dq);
  {
    std::printf("[%s] %s\n  vs fp32 ref: dq %.3e dk %.3e dv %.3e\n  vs fp64:     dq %.3e dk %.3e dv %.3e"
                "  (cpu fp32 ref dq vs fp64 %.3e)\n",
                c.name.c_str(), describe(in).c_str(), dq32, dk32, dv32, dq64, dk64, dv64, ref_dq64);
  }
  // NaN compares false: an unwritten (poisoned) element fails here.
  EXPECT_LT(dq32, kFp32Tolerance) << c.name << " dq vs backward_fp32, " << describe(in);
  EXPECT_LT(dk32, kFp32Tolerance) << c.name << " dk vs backward_fp32, " << describe(in);
  EXPECT_LT(dv32, kFp32Tolerance) << c.name << " dv vs backward_fp32, " << describe(in);
  EXPECT_LT(dq64, kFp32Tolerance) << c.name << " dq vs attention_fp64, " << describe(in);
  EXPECT_LT(dk64, kFp32Tolerance) << c.name << " dk vs attention_fp64, " << describe(in);
  EXPECT_LT(dv64, kFp32Tolerance) << c.name << " dv vs attention_fp64, " << describe(in);
}

Case make_case(std::string name, ref::AttentionShape sh, ref::CausalMode causal = ref::CausalMode::kNone) {
  Case c;
  c.name = std::move(name);
  c.shape = sh;
  c.causal = causal;
  return c;
}

std::vector<Case> all_cases() {
  using ref::CausalMode;
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = cases.size() + 17;
    cases.push_back(std::move(c));
  };
  add(make_case("noncausal_d64", shape(2, 4, 4, 100, 100, 64)));
  add(make_case("noncausal_d128_tails", shape(1, 2, 2, 77, 131, 128)));
  add(make_case("noncausal_d256", shape(1, 2, 1, 65, 70, 256)));
  add(make_case("topleft_square_d64", shape(2, 2, 2, 130, 130, 64), CausalMode::kTopLeft));
  add(make_case("topleft_wide_d128", shape(1, 2, 2, 70, 150, 128), CausalMode::kTopLeft));
  add(make_case("topleft_tall_d64", shape(1, 2, 2, 150, 70, 64), CausalMode::kTopLeft));
  add(make_case("bottomright_tall_d64", shape(1, 2, 2, 150, 70, 64), CausalMode::kBottomRight));
  add(make_case("bottomright_wide_d128", shape(1, 2, 1, 50, 200, 128), CausalMode::kBottomRight));
  add(make_case("bottomright_d256", shape(1, 1, 1, 40, 33, 256), CausalMode::kBottomRight));
  add(make_case("gqa_4to2_topleft", shape(2, 4, 2, 96, 96, 64), CausalMode::kTopLeft));
  add(make_case("mqa_8to1", shape(1, 8, 1, 40, 90, 128)));
  add(make_case("n1_m1", shape(1, 2, 2, 1, 1, 64)));
  add(make_case("n1_m300", shape(1, 2, 2, 1, 300, 64)));
  add(make_case("n300_m1_topleft", shape(1, 1, 1, 300, 1, 128), CausalMode::kTopLeft));
  {
    Case c = make_case("custom_scale", shape(1, 2, 2, 64, 64, 64));
    c.scale = 0.3;
    add(c);
  }
  {
    Case c = make_case("no_centering", shape(1, 2, 2, 80, 90, 128), CausalMode::kTopLeft);
    c.center_keys = false;
    add(c);
  }
  {
    Case c = make_case("packed_noncausal", shape(1, 2, 1, 100, 128, 64));
    c.cu_q = {0, 30, 30, 95, 100};
    c.cu_k = {0, 40, 41, 100, 128};
    add(c);
  }
  {
    Case c = make_case("packed_topleft", shape(1, 4, 2, 140, 120, 128), CausalMode::kTopLeft);
    c.cu_q = {0, 70, 71, 140};
    c.cu_k = {0, 50, 51, 120};
    add(c);
  }
  {
    Case c = make_case("packed_bottomright", shape(1, 2, 2, 100, 160, 64), CausalMode::kBottomRight);
    c.cu_q = {0, 60, 60, 100};
    c.cu_k = {0, 20, 90, 160};
    add(c);
  }
  {
    Case c = make_case("packed_batch2_d256", shape(2, 2, 2, 50, 50, 256), CausalMode::kTopLeft);
    c.cu_q = {0, 17, 50};
    c.cu_k = {0, 17, 50};
    add(c);
  }
  {
    Case c = make_case("deterministic_gqa", shape(2, 4, 2, 100, 140, 128), CausalMode::kBottomRight);
    c.deterministic = true;
    add(c);
  }
  {
    Case c = make_case("deterministic_packed_d64", shape(1, 2, 2, 100, 128, 64), CausalMode::kTopLeft);
    c.cu_q = {0, 30, 30, 95, 100};
    c.cu_k = {0, 40, 41, 100, 128};
    c.deterministic = true;
    add(c);
  }
  {
    Case c = make_case("deterministic_d256", shape(1, 2, 1, 70, 45, 256));
    c.deterministic = true;
    add(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp32BackwardCase, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) { return param_info.param.name; });

// Deterministic mode: two runs give the same bits.
TEST(Fp32Backward, DeterministicModeIsBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  Case c = make_case("repeat", shape(1, 4, 2, 300, 260, 64), ref::CausalMode::kTopLeft);
  const ref::AttentionInputs in = make_inputs(c);
  const GpuResult first = run_gpu(in, true, true);
  const GpuResult second = run_gpu(in, true, true);
  ASSERT_TRUE(first.status.ok()) << first.status.message;
  ASSERT_TRUE(second.status.ok()) << second.status.message;
  ASSERT_EQ(first.grads.dq.size(), second.grads.dq.size());
  EXPECT_EQ(0, std::memcmp(first.grads.dq.data(), second.grads.dq.data(), first.grads.dq.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(first.grads.dk.data(), second.grads.dk.data(), first.grads.dk.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(first.grads.dv.data(), second.grads.dv.data(), first.grads.dv.size() * sizeof(float)));
}

// Row subset: dq of the chosen rows equals the full dq's rows; dk/dv equal the
// reference on inputs whose grad_out is zero outside the chosen rows (a row
// with u_i = 0 has a_ij = delta_i = 0, so it adds nothing to dk or dv).
void check_subset(const Case& c, const std::vector<int32_t>& slices, const std::vector<int32_t>& rows,
                  bool deterministic) {
  const ref::AttentionInputs in = make_inputs(c);
  const auto& sh = in.shape;
  ref::AttentionInputs masked = in;
  std::vector<char> chosen(static_cast<size_t>(sh.q_rows()), 0);
  for (int32_t flat : slices) {
    for (int32_t n : rows) chosen[static_cast<size_t>(flat * sh.q_len + n)] = 1;
  }
  for (int64_t r = 0; r < sh.q_rows(); ++r) {
    if (chosen[static_cast<size_t>(r)]) continue;
    std::fill_n(masked.grad_out.begin() + r * sh.head_dim, sh.head_dim, 0.0f);
  }
  const ref::Gradients full = ref::backward_fp32(in);
  const ref::Gradients part = ref::backward_fp32(masked);
  std::vector<float> want_dq;
  for (int32_t flat : slices) {
    for (int32_t n : rows) {
      const auto* row = &full.dq[static_cast<size_t>((flat * sh.q_len + n) * sh.head_dim)];
      want_dq.insert(want_dq.end(), row, row + sh.head_dim);
    }
  }
  const GpuResult got = run_gpu(in, true, deterministic, slices, rows);
  ASSERT_TRUE(got.status.ok()) << got.status.message;
  const double dq = ref::relative_error(got.grads.dq, want_dq);
  const double dk = ref::relative_error(got.grads.dk, part.dk);
  const double dv = ref::relative_error(got.grads.dv, part.dv);
  {
    std::printf("[%s subset%s] %s: dq %.3e dk %.3e dv %.3e\n", c.name.c_str(), deterministic ? " det" : "",
                describe(in).c_str(), dq, dk, dv);
  }
  EXPECT_LT(dq, kFp32Tolerance) << c.name << " subset dq, " << describe(in);
  EXPECT_LT(dk, kFp32Tolerance) << c.name << " subset dk, " << describe(in);
  EXPECT_LT(dv, kFp32Tolerance) << c.name << " subset dv, " << describe(in);
}

TEST(Fp32Backward, RowSubsetMatchesReferenceRows) {
  SKIP_WITHOUT_GPU();
  // slices are flat b * Hq + h: (0, 1), (1, 0), (1, 3) of B=2, Hq=4, Hkv=2.
  const std::vector<int32_t> slices = {1, 4, 7};
  const std::vector<int32_t> rows = {0, 5, 17, 63, 64, 65, 99, 129};
  const Case c = make_case("subset_gqa_topleft", shape(2, 4, 2, 130, 150, 64), ref::CausalMode::kTopLeft);
  check_subset(c, slices, rows, false);
  check_subset(c, slices, rows, true);
  const Case d = make_case("subset_d128_noncausal", shape(1, 2, 2, 90, 70, 128));
  check_subset(d, {1}, {3, 89}, false);
}

// Sink-like keys: a large common key offset (and sharp queries) makes the FP32
// logits large, |s| up to ~2e4, so P carries ~|s| 2^-24 absolute error. Key
// centering removes the offset's share of the logits (the exact gradients are
// invariant to it). Prints the floor with and without; asserts the centred one.
TEST(Fp32Backward, KeyCenteringRemovesOffsetFloor) {
  SKIP_WITHOUT_GPU();
  struct Regime {
    const char* name;
    int64_t d;
    float offset, q_gain;
  };
  const Regime regimes[] = {{"offset_200", 64, 200.0f, 1.0f},
                            {"offset_200_sharp", 64, 200.0f, 8.0f},
                            {"offset_300_sharp_d128", 128, 300.0f, 20.0f}};
  for (const Regime& r : regimes) {
    Case c = make_case(r.name, shape(1, 2, 2, 128, 128, r.d), ref::CausalMode::kTopLeft);
    c.key_offset = r.offset;
    c.q_gain = r.q_gain;
    const ref::AttentionInputs in = make_inputs(c);
    const ref::ExactAttention exact = ref::attention_fp64(in);
    const GpuResult centered = run_gpu(in, true, false);
    const GpuResult raw = run_gpu(in, false, false);
    ASSERT_TRUE(centered.status.ok()) << centered.status.message;
    ASSERT_TRUE(raw.status.ok()) << raw.status.message;
    double err_c[3], err_r[3];
    const std::vector<float>* got_c[3] = {&centered.grads.dq, &centered.grads.dk, &centered.grads.dv};
    const std::vector<float>* got_r[3] = {&raw.grads.dq, &raw.grads.dk, &raw.grads.dv};
    const std::vector<double>* want[3] = {&exact.dq, &exact.dk, &exact.dv};
    for (int i = 0; i < 3; ++i) {
      err_c[i] = ref::relative_error(*got_c[i], *want[i]);
      err_r[i] = ref::relative_error(*got_r[i], *want[i]);
    }
    std::printf("[%s] vs fp64: centered dq %.2e dk %.2e dv %.2e | uncentered dq %.2e dk %.2e dv %.2e\n", r.name,
                err_c[0], err_c[1], err_c[2], err_r[0], err_r[1], err_r[2]);
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(err_c[i], 1e-5) << r.name << " centered d" << "qkv"[i];
    }
    EXPECT_LT(err_c[0], err_r[0]) << r.name << ": centering should beat raw keys on offset keys";
  }
}

// The masked truth in FP64: s_ij = alpha q_i.k_j + bias_ij on the pairs that
// visible_keys() and the mask allow, softmax, and the gradients of the rows
// chosen (every row when `rows` is empty): dq of those rows (slice-major), dk
// and dv from those rows only. Rows with no allowed key contribute nothing.
ref::ExactAttention masked_truth(const ref::AttentionInputs& in, const HostMask& mask,
                                 const std::vector<int32_t>& slices = {}, const std::vector<int32_t>& rows = {}) {
  const auto& sh = in.shape;
  const int64_t d = sh.head_dim, group = sh.q_heads / sh.kv_heads;
  std::vector<int32_t> all_slices = slices, all_rows = rows;
  if (slices.empty()) {
    for (int32_t f = 0; f < sh.batch * sh.q_heads; ++f) all_slices.push_back(f);
    for (int32_t n = 0; n < sh.q_len; ++n) all_rows.push_back(n);
  }
  ref::ExactAttention out;
  out.dq.assign(all_slices.size() * all_rows.size() * static_cast<size_t>(d), 0.0);
  out.dk.assign(static_cast<size_t>(sh.kv_elements()), 0.0);
  out.dv.assign(static_cast<size_t>(sh.kv_elements()), 0.0);
  std::vector<double> p(static_cast<size_t>(sh.kv_len)), a(static_cast<size_t>(sh.kv_len));
  for (size_t si = 0; si < all_slices.size(); ++si) {
    const int64_t b = all_slices[si] / sh.q_heads, h = all_slices[si] % sh.q_heads, hk = h / group;
    const float* kh = &in.k[static_cast<size_t>(sh.kv_offset(b, hk, 0))];
    const float* vh = &in.v[static_cast<size_t>(sh.kv_offset(b, hk, 0))];
    for (size_t ri = 0; ri < all_rows.size(); ++ri) {
      const int64_t n = all_rows[ri];
      const float* q = &in.q[static_cast<size_t>(sh.q_offset(b, h, n))];
      const float* u = &in.grad_out[static_cast<size_t>(sh.q_offset(b, h, n))];
      const ref::KeyRange keys = ref::visible_keys(in, n);
      double mx = -INFINITY;
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        double s = -INFINITY;
        const bool allowed = mask.kind != gpu::MaskKind::kBool || mask.values[mask.offset(b, h, n, j)] != 0.0f;
        if (j >= keys.begin && j < keys.end && allowed) {
          s = 0.0;
          for (int64_t c = 0; c < d; ++c) s += static_cast<double>(q[c]) * kh[j * d + c];
          s *= in.scale;
          if (mask.kind == gpu::MaskKind::kBias) s += mask.values[mask.offset(b, h, n, j)];
        }
        p[j] = s;
        mx = std::max(mx, s);
      }
      if (mx == -INFINITY) continue;
      double sum = 0.0, delta = 0.0;
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        p[j] = p[j] == -INFINITY ? 0.0 : std::exp(p[j] - mx);
        sum += p[j];
      }
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        p[j] /= sum;
        a[j] = 0.0;
        for (int64_t c = 0; c < d; ++c) a[j] += static_cast<double>(u[c]) * vh[j * d + c];
        delta += p[j] * a[j];
      }
      double* dq = &out.dq[(si * all_rows.size() + ri) * static_cast<size_t>(d)];
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        if (p[j] == 0.0) continue;
        const double g = p[j] * (a[j] - delta);
        double* dk = &out.dk[static_cast<size_t>(sh.kv_offset(b, hk, j))];
        double* dv = &out.dv[static_cast<size_t>(sh.kv_offset(b, hk, j))];
        for (int64_t c = 0; c < d; ++c) {
          dq[c] += in.scale * g * kh[j * d + c];
          dk[c] += in.scale * g * q[c];
          dv[c] += p[j] * u[c];
        }
      }
    }
  }
  return out;
}

void expect_masked(const char* name, const ref::AttentionInputs& in, const HostMask& mask, bool deterministic,
                   const std::vector<int32_t>& slices = {}, const std::vector<int32_t>& rows = {}) {
  const ref::ExactAttention want = masked_truth(in, mask, slices, rows);
  const GpuResult got = run_gpu(in, true, deterministic, slices, rows, mask);
  ASSERT_TRUE(got.status.ok()) << name << ": " << got.status.message;
  const double dq = ref::relative_error(got.grads.dq, want.dq);
  const double dk = ref::relative_error(got.grads.dk, want.dk);
  const double dv = ref::relative_error(got.grads.dv, want.dv);
  std::printf("[%s] %s: vs masked fp64 dq %.3e dk %.3e dv %.3e\n", name, describe(in).c_str(), dq, dk, dv);
  EXPECT_LT(dq, kFp32Tolerance) << name << " dq";
  EXPECT_LT(dk, kFp32Tolerance) << name << " dk";
  EXPECT_LT(dv, kFp32Tolerance) << name << " dv";
}

// Key padding, as trainers pass it: a bool (B, 1, 1, M) mask broadcast over
// heads and rows (stride 0), right-padded in batch 0 and left- and right-
// padded in batch 1; with causal top-left the first rows of batch 1 see no
// allowed key (zero gradients). GQA, tails in both N and M.
TEST(Fp32Backward, KeyPaddingMaskMatchesMaskedTruth) {
  SKIP_WITHOUT_GPU();
  for (const auto causal : {ref::CausalMode::kNone, ref::CausalMode::kTopLeft}) {
    Case c = make_case("key_padding", shape(2, 4, 2, 70, 83, 64), causal);
    const ref::AttentionInputs in = make_inputs(c);
    HostMask mask;
    mask.kind = gpu::MaskKind::kBool;
    mask.strides[0] = 83;
    mask.strides[3] = 1;
    mask.values.assign(2 * 83, 1.0f);
    for (int j = 63; j < 83; ++j) mask.values[static_cast<size_t>(j)] = 0.0f;
    for (int j = 0; j < 5; ++j) mask.values[static_cast<size_t>(83 + j)] = 0.0f;
    for (int j = 73; j < 83; ++j) mask.values[static_cast<size_t>(83 + j)] = 0.0f;
    expect_masked(causal == ref::CausalMode::kNone ? "key_padding" : "key_padding_causal", in, mask, false);
  }
}

// An additive bias per (head, row, key), broadcast over the batch, with -inf
// entries (and one row all -inf), at d = 128 in deterministic mode.
TEST(Fp32Backward, AdditiveBiasMatchesMaskedTruth) {
  SKIP_WITHOUT_GPU();
  Case c = make_case("bias", shape(2, 2, 2, 66, 90, 128));
  const ref::AttentionInputs in = make_inputs(c);
  HostMask mask;
  mask.kind = gpu::MaskKind::kBias;
  mask.strides[1] = 66 * 90;
  mask.strides[2] = 90;
  mask.strides[3] = 1;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  mask.values.resize(2 * 66 * 90);
  for (size_t i = 0; i < mask.values.size(); ++i) mask.values[i] = i % 7 == 3 ? -INFINITY : normal(rng);
  for (int j = 0; j < 90; ++j) mask.values[static_cast<size_t>(10 * 90 + j)] = -INFINITY;
  expect_masked("bias_det", in, mask, true);
  expect_masked("bias", in, mask, false);
}

// The monitor's sampled rows under a full (B, Hq, N, M) bool mask.
TEST(Fp32Backward, RowSubsetWithMaskMatchesMaskedTruth) {
  SKIP_WITHOUT_GPU();
  Case c = make_case("subset_mask", shape(2, 4, 2, 80, 100, 64), ref::CausalMode::kTopLeft);
  const ref::AttentionInputs in = make_inputs(c);
  HostMask mask;
  mask.kind = gpu::MaskKind::kBool;
  mask.strides[0] = 4 * 80 * 100;
  mask.strides[1] = 80 * 100;
  mask.strides[2] = 100;
  mask.strides[3] = 1;
  std::mt19937 rng(9);
  std::bernoulli_distribution keep(0.7);
  mask.values.resize(2 * 4 * 80 * 100);
  for (auto& x : mask.values) x = keep(rng) ? 1.0f : 0.0f;
  expect_masked("subset_mask", in, mask, false, {1, 4, 7}, {0, 3, 40, 64, 79});
  expect_masked("subset_mask_det", in, mask, true, {1, 4, 7}, {0, 3, 40, 64, 79});
}

TEST(Fp32Backward, RejectsUnsupportedInputs) {
  // Validation needs no device.
  gpu::Fp32BackwardParams p;
  p.shape.head_dim = 96;
  gpu::Status s = gpu::validate(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("head_dim 96"), std::string::npos) << s.message;
  p.shape.head_dim = 64;
  p.shape.q_heads = 6;
  p.shape.kv_heads = 4;
  s = gpu::validate(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("GQA"), std::string::npos) << s.message;
  p.shape.q_heads = 4;
  p.shape.kv_heads = 2;
  int32_t dummy = 0;
  p.shape.cu_seqlens_q = &dummy;
  s = gpu::validate(p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("together"), std::string::npos) << s.message;
  EXPECT_EQ(gpu::fp32_attention_backward(p, nullptr, 0, nullptr).cuda, cudaErrorInvalidValue);
}

}  // namespace
}  // namespace gaugewatch
