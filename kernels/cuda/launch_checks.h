#pragma once
// Host-side preconditions and failure statuses shared by the kernels'
// launchers (fp32_backward.cu, bf16_backward.cu, metrics.cu): one check, one
// message, wherever a launcher needs it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/problem.h"  // Status

namespace gaugewatch::gpu::checks {

inline constexpr int64_t kMaxGridY = 65535;  // one grid row per (batch, head)
inline constexpr size_t kAlign = 256;         // workspace sub-buffers

inline size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

inline Status invalid(std::string message) { return Status{cudaErrorInvalidValue, std::move(message)}; }

// A failed CUDA call's status: what failed and CUDA's description of `err`.
inline Status cuda_failure(const char* what, cudaError_t err) {
  return Status{err, std::string(what) + ": " + cudaGetErrorString(err)};
}

// GQA divisibility and lengths the kernels index with int.
inline Status check_heads_and_lengths(int64_t q_heads, int64_t kv_heads, int64_t q_len, int64_t kv_len) {
  if (q_heads % kv_heads != 0) {
    return invalid("kv_heads " + std::to_string(kv_heads) + " does not divide q_heads " + std::to_string(q_heads) +
                   " (GQA)");
  }
  if (q_len > INT32_MAX || kv_len > INT32_MAX) return invalid("q_len and kv_len must fit in int32");
  return {};
}

// The caller's workspace: at least `needed` bytes (null only when none are needed).
inline Status check_workspace(const void* workspace, size_t workspace_bytes, size_t needed) {
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return invalid("workspace too small: need " + std::to_string(needed) + " bytes");
  }
  return {};
}

// Packed sequences: both offset arrays or neither, and a segment count.
inline Status check_packing(const int32_t* cu_q, const int32_t* cu_k, int64_t num_segments) {
  if ((cu_q == nullptr) != (cu_k == nullptr)) return invalid("cu_seqlens_q and cu_seqlens_k must be given together");
  if (cu_q != nullptr && (num_segments < 1 || num_segments > INT32_MAX)) {
    return invalid("packed sequences need num_segments >= 1");
  }
  return {};
}

// attn_mask: a known kind with its data, or none.
inline Status check_mask(const AttentionMask& mask) {
  if (mask.kind != MaskKind::kNone && mask.kind != MaskKind::kBool && mask.kind != MaskKind::kBias) {
    return invalid("unknown attn_mask kind");
  }
  if (mask.any() && mask.data == nullptr) return invalid("attn_mask data must be non-null");
  return {};
}

}  // namespace gaugewatch::gpu::checks
