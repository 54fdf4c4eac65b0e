// Launcher of key centring: validation, workspace, the split count and the two
// passes in order (math: kernels/cuda/key_centring.h). Host code only (no
// <<<>>>; key_centring_launch.cu launches), so the CPU emulation compiles this
// same file against its runtime.
// Build: target gaugewatch_cuda (sm_90a). Run: tests/cuda/key_centring_test.cpp.

#include "kernels/cuda/key_centring.h"

#include <cstdint>
#include <string>

#include "kernels/cuda/key_centring_args.cuh"
#include "kernels/cuda/launch_checks.h"

namespace gaugewatch::gpu {

namespace {

using checks::invalid;
using checks::kMaxGridY;

// Blocks per (b, hk): enough for about two waves of a large GPU when there are
// few heads, at least 128 keys a block. A function of the shape only, so the
// FP64 sums (and an FP32 key's rounding) never depend on the device.
int splits_of(const ProblemShape& s) {
  const int64_t pairs = s.batch * s.kv_heads;
  const int64_t wanted = pairs >= 256 ? 1 : (256 + pairs - 1) / pairs;
  const int64_t most = (s.kv_len + 127) / 128;
  const int64_t splits = wanted < most ? wanted : most;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

size_t sums_bytes(const KeyCentringParams& p) {
  const ProblemShape& s = p.shape;
  return static_cast<size_t>(s.batch * s.kv_heads * splits_of(s) * s.head_dim) * sizeof(double);
}

}  // namespace

Status validate(const KeyCentringParams& p) {
  const ProblemShape& s = p.shape;
  if (s.head_dim < 1 || s.head_dim > detail::kCentringMaxHeadDim) {
    return invalid("head_dim " + std::to_string(s.head_dim) + " is not supported by key centring (1..256)");
  }
  if (s.batch < 0 || s.q_heads <= 0 || s.kv_heads <= 0 || s.q_len < 0 || s.kv_len < 0) {
    return invalid("shape must have batch, q_len, kv_len >= 0 and q_heads, kv_heads > 0");
  }
  if (Status st = checks::check_heads_and_lengths(s.q_heads, s.kv_heads, s.q_len, s.kv_len); !st.ok()) return st;
  if (s.batch * s.kv_heads > kMaxGridY) return invalid("batch * kv_heads exceeds 65535");
  if (p.lse_len < s.q_len) return invalid("lse must have at least q_len rows (L >= N)");
  if (p.dtype != ElementType::kBf16 && p.dtype != ElementType::kFp16 && p.dtype != ElementType::kFp32) {
    return invalid("q and k must be bfloat16, float16 or float32");
  }
  if (p.policy != CentringPolicy::kAuto && p.policy != CentringPolicy::kAlways && p.policy != CentringPolicy::kNever) {
    return invalid("unknown centring policy");
  }
  const bool any_q = s.batch * s.q_heads * p.lse_len > 0, any_k = s.batch * s.kv_heads * s.kv_len > 0;
  if (any_q && (p.q == nullptr || p.lse == nullptr || p.lse_shifted == nullptr)) {
    return invalid("q, lse and lse_shifted must be non-null");
  }
  if (any_k && (p.k == nullptr || p.k_centred == nullptr)) return invalid("k and k_centred must be non-null");
  if (s.batch * s.kv_heads > 0 && p.kbar == nullptr) return invalid("kbar must be non-null");
  return {};
}

size_t key_centring_workspace_bytes(const KeyCentringParams& p) { return 2 * checks::round_up(sums_bytes(p)); }

Status center_keys(const KeyCentringParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Status status = validate(p);
  if (!status.ok()) return status;
  status = checks::check_workspace(workspace, workspace_bytes, key_centring_workspace_bytes(p));
  if (!status.ok()) return status;
  const ProblemShape& s = p.shape;
  char* ws = static_cast<char*>(workspace);
  detail::CentringArgs a{};
  a.q = p.q;
  a.k = p.k;
  a.lse = p.lse;
  a.k_centred = p.k_centred;
  a.lse_shifted = p.lse_shifted;
  a.kbar = p.kbar;
  a.q_strides = p.q_strides;
  a.k_strides = p.k_strides;
  a.k_centred_strides = p.k_centred_strides;
  for (int i = 0; i < 3; ++i) a.lse_strides[i] = p.lse_strides[i];
  a.column_sums = reinterpret_cast<double*>(ws);
  a.column_squares = reinterpret_cast<double*>(ws + checks::round_up(sums_bytes(p)));
  a.hq = s.q_heads;
  a.hkv = s.kv_heads;
  a.n = s.q_len;
  a.m = s.kv_len;
  a.lse_len = p.lse_len;
  a.d = static_cast<int>(s.head_dim);
  a.splits = splits_of(s);
  a.keys_per_split = (s.kv_len + a.splits - 1) / a.splits;
  a.dtype = static_cast<int>(p.dtype);
  a.policy = static_cast<int>(p.policy);
  a.ratio = p.offset_spread_ratio;
  a.scale = static_cast<float>(s.scale);
  const int64_t pairs = s.batch * s.kv_heads;
  cudaError_t err = detail::launch_centring_stats(a, pairs, stream);
  if (err != cudaSuccess) return Status{err, std::string("key centring statistics: ") + cudaGetErrorString(err)};
  err = detail::launch_centring_apply(a, pairs, stream);
  if (err != cudaSuccess) return Status{err, std::string("key centring: ") + cudaGetErrorString(err)};
  return {};
}

}  // namespace gaugewatch::gpu
