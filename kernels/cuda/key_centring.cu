// Launcher of key centring: validation, the summation order's partition
// (cluster size, batch, query parts; key_centring_args.cuh), the apply
// kernel's blocks and the instantiation (element type; 16-byte chunks or
// single elements); math in kernels/cuda/key_centring.h. Host code only (no
// <<<>>>; key_centring_launch.cu launches), so the CPU emulation compiles
// this same file against its runtime.
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

int element_size(ElementType t) { return t == ElementType::kFp32 ? 4 : 2; }

// Shares (kernel 1's blocks) per (b, hk), a function of the shape only (so
// the FP64 sums never depend on the device): enough blocks for about one per
// SM of a 132-SM GPU when there are few heads, and shares of at most
// kCentringOrderShareBytes; a power of two (clusters of 2, 4 or 8 blocks
// pack a GPC's SMs), at most the portable cluster size, at least 16 keys a
// block. It fixes the summation order (key_centring_args.cuh).
int cluster_of(const ProblemShape& s, int64_t row_bytes) {
  const int64_t pairs = s.batch * s.kv_heads;
  const int64_t fill = pairs >= 132 ? 1 : (132 + pairs - 1) / pairs;
  const int64_t fit = (s.kv_len * row_bytes + detail::kCentringOrderShareBytes - 1) / detail::kCentringOrderShareBytes;
  const int64_t want = fill > fit ? fill : fit;
  const int64_t most = (s.kv_len + 15) / 16;
  int c = 1;
  while (c < detail::kCentringMaxCluster && c < want) c *= 2;
  while (c > 1 && c > most) c /= 2;
  return c;
}

// Threads per query row (a power of two), which fixes the order of the
// q . kbar additions: the fewest that let two tiles of
// kCentringOrderThreads / parts rows, each row padded against bank
// conflicts, fit kCentringOrderShareBytes (the staged kernel's layout).
int query_parts_of(int64_t row_bytes, bool vec) {
  for (int parts = 1;; parts *= 2) {
    const int64_t words = row_bytes / 4;
    const int64_t stride = vec ? row_bytes + 4 * (((4 * parts - words) % 32 + 32) % 32) : (row_bytes + 15) / 16 * 16;
    if (parts == 32 || 2 * (detail::kCentringOrderThreads / parts) * stride <= detail::kCentringOrderShareBytes) {
      return parts;
    }
  }
}

bool aligned_operand(const void* base, const OperandStrides& st, int esize) {
  return checks::aligned16(base) && (st.batch * esize) % 16 == 0 && (st.head * esize) % 16 == 0 &&
         (st.row * esize) % 16 == 0;
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
  if (p.lse_shifted_len != 0 && p.lse_shifted_len < p.lse_len) {
    return invalid("lse_shifted must have at least lse's rows (L_out >= L)");
  }
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

Status center_keys(const KeyCentringParams& p, cudaStream_t stream) {
  Status status = validate(p);
  if (!status.ok()) return status;
  const ProblemShape& s = p.shape;
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
  a.hq = s.q_heads;
  a.hkv = s.kv_heads;
  a.n = s.q_len;
  a.m = s.kv_len;
  a.lse_len = p.lse_len;
  a.lse_out_len = p.lse_shifted_len == 0 ? p.lse_len : p.lse_shifted_len;
  a.d = static_cast<int>(s.head_dim);
  const int esize = element_size(p.dtype);
  const int64_t row_bytes = s.head_dim * esize;
  const bool vec = row_bytes % 16 == 0 && aligned_operand(p.q, p.q_strides, esize) &&
                   aligned_operand(p.k, p.k_strides, esize) &&
                   aligned_operand(p.k_centred, p.k_centred_strides, esize);
  a.vec = vec ? 1 : 0;
  a.pairs = s.batch * s.kv_heads;
  a.sums = p.policy != CentringPolicy::kNever && s.kv_len > 0 ? 1 : 0;
  a.cluster = cluster_of(s, row_bytes);
  a.keys_per_block = (s.kv_len + a.cluster - 1) / a.cluster;
  const int64_t batch = detail::kCentringOrderBatchBytes / row_bytes;
  a.batch_rows = batch > 1 ? batch : 1;
  a.query_parts = query_parts_of(row_bytes, vec);
  // Kernel 2: about kCentringApplyBlocksTarget blocks, at least
  // kCentringApplyMinKeys keys a block (its results do not depend on these).
  const int64_t pairs = a.pairs > 0 ? a.pairs : 1;
  const int64_t by_target = (detail::kCentringApplyBlocksTarget + pairs - 1) / pairs;
  const int64_t by_keys = (s.kv_len + detail::kCentringApplyMinKeys - 1) / detail::kCentringApplyMinKeys;
  const int64_t apply = by_target < by_keys ? by_target : by_keys;
  a.apply_blocks = static_cast<int>(apply > 1 ? apply : 1);
  a.apply_keys = (s.kv_len + a.apply_blocks - 1) / a.apply_blocks;
  const int64_t lse_rows = s.q_heads / s.kv_heads * a.lse_out_len;
  a.apply_lse_rows = (lse_rows + a.apply_blocks - 1) / a.apply_blocks;
  a.dtype = static_cast<int>(p.dtype);
  a.policy = static_cast<int>(p.policy);
  a.ratio = p.offset_spread_ratio;
  a.scale = static_cast<float>(s.scale);
  const cudaError_t err = detail::launch_centring(a, a.pairs, stream);
  if (err != cudaSuccess) return checks::cuda_failure("key centring", err);
  return {};
}

}  // namespace gaugewatch::gpu
