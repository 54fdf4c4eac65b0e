#pragma once
// Fused BF16 attention backward on the GPU (sm_90), three variants of one
// kernel pair: "bf16" (what FlashAttention/cuDNN compute), "gproj" and
// "pivot" (docs/numerics.md). BF16 operands, FP32 accumulators, BF16 outputs.
//
// Math (docs/numerics.md notation; one batch element, query head h, key/value head
// h / (Hq / Hkv); alpha = scale; every product below is a BF16 x BF16 tensor
// core MMA with FP32 accumulation unless stated):
//   delta_i = sum_c dO_ic O_ic               FP32, from the saved BF16 output
//   s_ij    = q_i . k_j                      (MMA)
//   P_ij    = exp2(s_ij alpha log2e - lse_i log2e)    FP32, from the saved lse
//   dP_ij   = dO_i . v_j                     (MMA)
//   t_ij    = bf16(P_ij (dP_ij - delta_i)),  r_ij = bf16(P_ij)
//   dV_j    = sum_i r_ij dO_i                dK_j = alpha sum_i t_ij q_i
//   dQ_i    = alpha sum_j t_ij k_j
// gproj: rho_i = sum_j t_ij, m_i = sum_j r_ij (FP32 sums of the BF16 values
//   the MMAs consume), lambda_i = rho_i / m_i (0 when m_i = 0), and
//   dQ'_i = alpha (sum_j t_ij k_j - lambda_i sum_j r_ij k_j)
//   dK'_j = alpha (sum_i t_ij q_i - sum_i r_ij bf16(lambda_i q_i))
//   i.e. the contraction of t' = t - lambda r, whose row sums are zero.
// pivot: j*(i) = argmax_j P_ij (ties to the lower j), and
//   dQ'_i = alpha (sum_j t_ij k_j - rho_i k_{j*(i)})
//   dK'_j = alpha (sum_i t_ij q_i - sum_{i : j*(i) = j} rho_i q_i)   (FP32)
//
// Two structures (kernels/cuda/README.md counts their products):
// * key-outer (bf16_keyouter_kernel.cuh; the default for bf16 and pivot on
//   the Hopper pair when deterministic is false and no row diagnostics are
//   asked for; for gproj where gproj_path chooses it, by default at head
//   dim 64 and, where it runs warp-specialized, at 128 (GprojPath has the
//   measured times)): per key tile, loop over query tiles:
//   S, dP, t, r, dV, dK, and dQ accumulated in FP32 by atomics; pivot's rho_i
//   and j*(i) by atomics, then an O(N d) epilogue applies both rank-one
//   fix-ups. gproj, in two passes over the keys:
//     pass 1 (the key-outer kernel): as bf16, plus this block's partial
//       sums of the rounded t and r per row added to rho_i and m_i by FP32
//       atomics; dKacc_j = sum_i t_ij q_i kept in FP32;
//     lambda (O(N d)): lambda_i = rho_i / m_i (0 when m_i = 0) and the rows
//       bf16(-lambda_i q_i);
//     pass 2 (bf16_gproj_keys_kernel.cuh, 3 products per tile pair; with
//       keyouter_warp_specialized bf16_gproj_keys_ws_kernel.cuh, the same
//       per-tile code): S and r recomputed by the same instructions
//       (bit-identical r), C_j = sum_i r_ij bf16(-lambda_i q_i),
//       dK'_j = bf16(alpha (dKacc_j + C_j)), and per key block and query
//       tile dQacc_i += -lambda_i sum_j r_ij k_j by FP32 atomics;
//     dQ'_i = bf16(alpha dQacc_i).
//   8 products per tile pair against the pair's 9 for gproj.
//   bf16 and pivot run it by default on a warp-specialized block
//   (keyouter_warp_specialized; bf16_keyouter_ws_kernel.cuh: a TMA producer
//   warpgroup feeding two compute warpgroups through mbarriers; the same
//   per-tile work), and so does gproj's pass 1 (and its pass 2, likewise).
//   Not bitwise repeatable: the FP32 sums of dQ, rho, m and pivot's dK
//   fix-up take the order the atomics land in (the header states the
//   rounding); every other value is computed as in the pair.
// * the two-kernel pair (deterministic = true, row diagnostics, the mma.sync
//   pair, and gproj where gproj_path chooses it): a delta pre-pass; a query-outer
//   kernel (per query tile, loop over key tiles: S, dP, t, r, dQ += t K, and
//   for gproj U += r K and the row sums), which finishes dQ and writes
//   lambda (gproj) or rho and j* (pivot) per row; then a key-outer kernel
//   (per key tile, loop over the query tiles of every query head of its
//   group: S, dP, t, r recomputed by the same code, dV += r^T dO,
//   dK += t^T Q, for gproj dK -= r^T bf16(lambda Q), for pivot the O(N d)
//   rank-one fix-up). No atomics anywhere: every run is bit-identical. Both
//   kernels compute S and dP with the same instructions in the same order,
//   so the t and r the key-outer kernel contracts are bit-identical to those
//   summed into rho and m.
// Two implementations of the pair (Bf16KernelPair): the Hopper pair (warpgroup
// MMAs, bf16_backward_hopper.cuh; the default) and the mma.sync pair
// (baseline/bf16_mma_sync_kernel.cuh, kept as its measured baseline). For gproj the
// Hopper dq kernel also writes bf16(-lambda_i q_i) per row to the workspace,
// which its dkdv kernel stages like Q.
//
// Layouts: q, grad_out, out: (B, Hq, N, d); k, v: (B, Hkv, M, d); BF16, last
// dim contiguous, other strides free (SDPA's (B, N, H, d) views work), rows
// 16-byte aligned. lse: FP32 (B, Hq, N) natural-log, any batch/head strides,
// row stride 1 (cuDNN's (B, H, N, 1) is the same memory). dq, dk, dv: BF16
// (B, Hq, N, d) / (B, Hkv, M, d), last dim contiguous, other strides free
// (dq_strides, dk_strides, dv_strides; the torch op allocates them dense in
// q's, k's and v's stride order, kernels/torch/stride_order.h, so no copy
// follows), strides even: every store writes two adjacent BF16 as one 32-bit
// word. Packed calls use the same strides (packing only offsets rows within N
// and M). Causal masking, packing, GQA and rows with no visible key exactly
// as kernels/cuda/fp32_backward.h; an attn_mask (ProblemShape::mask) is
// refused by validate(): these kernels take no mask (the FP32 recompute and
// backend center do).
//
// Row diagnostics (optional, each FP32 (B, Hq, N) contiguous, null to skip;
// projection kNone only, so the projected variants spend no registers on them):
// the quantities the monitor's row-mass, sharpness and pivot metrics need,
// computed from the same t, r and P the MMAs consume.
//
// Build: target gaugewatch_cuda (sm_90a). Tests: tests/cuda/bf16_backward_test.cpp.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/problem.h"

namespace gaugewatch::gpu {

enum class Projection : int {
  kNone = 0,   // backend "bf16": the stock fused kernels' arithmetic
  kGproj = 1,  // backend "gproj"
  kPivot = 2,  // backend "pivot"
};

// gproj's structure without bitwise determinism: the key-outer kernel and
// its second pass over the keys (8 products per tile pair, FP32 atomics) or
// the two-kernel pair (9, no atomics). Measured on the H200
// (kernels/cuda/README.md), the key-outer gproj takes 0.80-0.85x the pair's
// time at head dim 64; at 128, with grid sections and both passes
// warp-specialized, 0.93-0.99x on the long, non-causal and GQA shapes and
// 0.98-1.02x on B4 H16 N4096 causal (three runs on 2026-12-03); without
// warp specialization (keyouter_warp_specialized false, or TMA maps that
// do not encode) it was 1.2-1.4x the pair there. At head dim 256
// (d256_key_outer) its two passes take 0.96-0.98x the pair's time (H100,
// three alternating rounds, 2026-12-05).
enum class GprojPath : int {
  // the key-outer gproj at head dim 64, at 128 where both its passes run
  // warp-specialized (bf16_uses_key_outer_ws) and at 256 where
  // d256_key_outer asks for it; the pair otherwise
  kAuto = 0,
  kPair = 1,
  kKeyOuter = 2,
};

struct Bf16RowDiagnostics {
  float* row_mass = nullptr;       // rho_i = sum_j t_ij
  float* abs_row_mass = nullptr;   // sum_j |t_ij|
  float* prob_mass = nullptr;      // m_i = sum_j r_ij
  float* p_max = nullptr;          // max_j P_ij
  float* logit_abs_max = nullptr;  // max_j |alpha s_ij| over visible keys
  int32_t* pivot = nullptr;        // j*(i) along M, -1 for rows with no key
  __host__ __device__ bool any() const {
    return row_mass || abs_row_mass || prob_mass || p_max || logit_abs_max || pivot;
  }
};

// Which implementation of the kernel pair runs (same math, same outputs to
// the BF16 error both carry). At head dim 256 the pair is the mma.sync
// pair whatever this says (the Hopper pair's tiles do not fit there,
// kernels/cuda/README.md, "Head dim 256"); its key-outer kernels run only
// with kHopper (d256_key_outer).
enum class Bf16KernelPair : int {
  kHopper = 0,            // warpgroup MMAs (bf16_backward_hopper.cuh)
  kMmaSyncBaseline = 1,   // mma.sync (baseline/bf16_mma_sync_kernel.cuh)
};

// Element strides of a (B, H, N) lse; rows are contiguous.
struct LseStrides {
  int64_t batch = 0, head = 0;
};

struct Bf16BackwardParams {
  ProblemShape shape;  // head_dim 64, 128 or 256 (256: d256_key_outer or the mma.sync pair); no mask
  // Inputs (device). BF16 tensors are passed as raw 16-bit storage.
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const uint16_t* out = nullptr;
  const uint16_t* grad_out = nullptr;
  const float* lse = nullptr;
  OperandStrides q_strides, k_strides, v_strides, out_strides, grad_out_strides;
  LseStrides lse_strides;
  // Outputs (device, BF16), at their strides (even: 32-bit stores).
  uint16_t* dq = nullptr;
  uint16_t* dk = nullptr;
  uint16_t* dv = nullptr;
  OperandStrides dq_strides, dk_strides, dv_strides;

  Projection projection = Projection::kGproj;
  Bf16KernelPair kernel_pair = Bf16KernelPair::kHopper;
  // true: bitwise repeatable results (the two-kernel pair, no atomics);
  // false: bf16 and pivot run the key-outer kernel (FP32 atomics), gproj
  // as gproj_path says.
  bool deterministic = false;
  // gproj's structure when deterministic is false (GprojPath). Ignored by
  // bf16 and pivot.
  GprojPath gproj_path = GprojPath::kAuto;
  // bf16 and pivot on the key-outer path, and gproj's first and second pass
  // there (bf16_gproj_keys_ws_kernel.cuh): true runs the warp-specialized
  // key-outer kernel
  // (bf16_keyouter_ws_kernel.cuh: a TMA producer warpgroup and two compute
  // warpgroups; the same per-tile products, bit for bit) where its TMA maps
  // can be encoded (bf16_uses_key_outer_ws), keyouter_kernel otherwise;
  // false: keyouter_kernel (12-19% slower on the H200 for bf16 and pivot,
  // kernels/cuda/README.md). Ignored by the pair.
  bool keyouter_warp_specialized = true;
  // Head dim 256, not deterministic, the Hopper pair, no diagnostics: true
  // (the default) runs bf16 and pivot on the key-outer kernel on the tensor
  // cores (bf16_keyouter_d256_kernel.cuh: 64 keys per block, 5 products per
  // tile pair, dQ by TMA tensor reductions; pivot's fix-up in its finish),
  // and gproj unless gproj_path is kPair (its second pass of 3 products,
  // bf16_gproj_keys_d256_kernel.cuh); false, and gproj with kPair, the
  // mma.sync pair. The key-outer kernel takes bf16 and pivot to 0.63-0.65x
  // the pair's time (H200), gproj's two passes to 0.96-0.98x (H100)
  // (kernels/cuda/README.md). Ignored at head dims 64 and 128.
  bool d256_key_outer = true;
  // Keys per block of gproj's second pass where it runs warp-specialized
  // (head dims 64 and 128; bf16_gproj_keys_ws_kernel.cuh): 0 (the default)
  // or 256, blocks of 256 keys (each warpgroup 128: half the -lambda U
  // reductions and the Q and bf16(-lambda Q) loads of the 128-key pass for
  // the same products, one block per SM, at head dim 64 U through the
  // writer warp instead of atomics; the same dK bit for bit, dQ within the
  // atomics' rounding); 128, the 128-key pass (the measured baseline: on
  // the H200 the 256-key pass takes 0.78-0.88x its kernel time,
  // kernels/cuda/README.md). Where K's 256-row map does not encode, the
  // 128-key pass runs (gproj_pass2_block_keys says which); ignored elsewhere
  // (the pair, the non-warp-specialized pass).
  int gproj_pass2_keys = 0;
  // The order of the 1-D grids (grid_order.cuh): heads in sections, block
  // index first within one. 0: sections whose query-side (key blocks) or
  // key-side (query tiles) streams fill half the device's L2, under causal
  // masking at least two waves of blocks; n > 0: sections at most n kv
  // heads wide; < 0: one section of all heads (heaviest blocks of every head first: the
  // order before sections, kept as the measured baseline).
  int grid_section = 0;

  Bf16RowDiagnostics diagnostics;

  // Fills the strides of contiguous (B, H, L, d) operands and outputs and
  // of a contiguous (B, H, N) lse.
  void set_contiguous_strides();
};

Status validate(const Bf16BackwardParams& params);

// Whether `params` run the key-outer kernel (otherwise the pair): head dim
// 64 or 128, Hopper pair, not deterministic, no diagnostics, and for gproj
// where gproj_path chooses it (gproj_runs_key_outer); at head dim 256
// where d256_key_outer asks for it (gproj: and gproj_path is not kPair).
bool bf16_uses_key_outer(const Bf16BackwardParams& params);

// Whether gproj_path takes gproj's key-outer structure for params (its head
// dim, and with kAuto at head dim 128 whether the warp-specialized kernels
// would run: keyouter_warp_specialized and maps that encode), whatever the
// other conditions of bf16_uses_key_outer; at head dim 256 where
// d256_key_outer asks for it and gproj_path is not kPair.
bool gproj_runs_key_outer(const Bf16BackwardParams& params);

// Whether `params` run the warp-specialized key-outer kernel: the key-outer
// path, keyouter_warp_specialized set, and
// TMA maps of Q, dO, K and V that the driver accepts (host call: encodes
// them, launches nothing).
bool bf16_uses_key_outer_ws(const Bf16BackwardParams& params);

// Keys per block of gproj's second pass for `params`: 0 where gproj's
// key-outer path does not run (other backends, the pair), 256 where the
// 256-key warp-specialized pass runs (gproj_pass2_keys 0 or 256 on the
// warp-specialized path, K's map in 256-row boxes encodes), 64 at head
// dim 256 (d256_key_outer), 128 otherwise (host call: encodes maps,
// launches nothing).
int gproj_pass2_block_keys(const Bf16BackwardParams& params);

// Device scratch (delta, lambda or rho/j* per row, and for gproj
// bf16(-lambda_i q_i) per row: d BF16 values; key-outer: the FP32 dQ
// accumulator, for pivot the per-row pivot code and the FP32 dK accumulator,
// for gproj the FP32 U and dK accumulators and m per row), in bytes.
size_t bf16_backward_workspace_bytes(const Bf16BackwardParams& params);

// Enqueues the backward on `stream`; never synchronizes, never aborts.
Status bf16_attention_backward(const Bf16BackwardParams& params, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace gaugewatch::gpu
