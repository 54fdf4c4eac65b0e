#pragma once
// The CUDA kernels behind the gaugewatch ops, launched from checked torch
// tensors on one stream: shared by the backward ops (ops_cuda.cpp) and the
// metrics op (ops_cuda_metrics.cpp), so the parameter blocks are filled in one
// place. Kernel APIs: kernels/cuda/bf16_backward.h, kernels/cuda/fp32_backward.h.

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <optional>
#include <tuple>

#include "kernels/cuda/bf16_backward.h"
#include "kernels/cuda/fp32_backward.h"
#include "kernels/cuda/key_centring.h"
#include "kernels/cuda/reference_problem.h"
#include "kernels/torch/attention_call.h"

namespace gaugewatch::torch_ops {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// cu_seqlens as int32 on q's device (undefined tensors when not packed).
// Offsets still on the CPU are checked (0 first, length last, non-decreasing);
// device offsets are trusted and clamped by the kernels, since checking them
// would synchronize the stream.
struct DeviceOffsets {
  at::Tensor q, k;
  int64_t segments() const { return q.defined() ? q.numel() - 1 : 0; }
};
DeviceOffsets device_offsets(const AttentionCall& call, const std::optional<at::Tensor>& cu_seqlens_q,
                             const std::optional<at::Tensor>& cu_seqlens_k, const at::Tensor& q);

// A checked attn_mask (kernels/torch/attention_mask.h) as the kernels read it:
// bool storage as is (uint8 0/1) or a float32 bias, with element strides along
// (B, Hq, N, M), 0 where it broadcasts. A broadcast (stride-0) view is read in
// place; only a bias of another floating dtype is converted, and then at the
// mask's own (unbroadcast) size.
struct DeviceMask {
  at::Tensor storage;        // keeps the data alive; undefined without a mask
  gpu::AttentionMask view;
};
DeviceMask device_mask(const std::optional<at::Tensor>& attn_mask);

// The problem's shape, scale, causal mode, packing and mask for the kernels.
gpu::ProblemShape problem_shape(const AttentionCall& call, const DeviceOffsets& offsets,
                                const DeviceMask& mask = {});

// The kernel pair of the fused BF16 backward, chosen once when the library
// loads: GAUGEWATCH_BF16_KERNEL=mma_sync selects the mma.sync baseline (for
// measuring the Hopper pair against it), anything else the Hopper pair.
// bf16 and pivot's key-outer path runs the warp-specialized kernel by default
// (Bf16BackwardParams::keyouter_warp_specialized); GAUGEWATCH_BF16_KERNEL=
// key_outer runs the key-outer kernel without warp specialization instead
// (its measured baseline), `ws` is the default spelled out; another
// non-empty value warns once on stderr and keeps the defaults.
gpu::Bf16KernelPair bf16_kernel_pair();

// The fused BF16 backward (BF16 operands, SDPA strides taken as they are when
// rows are 16-byte aligned); BF16 gradients dense in the stride order of q,
// k, v (stride_order.h), written in place by the kernels. `diag` only with
// projection kNone. deterministic: the two-kernel pair (bitwise repeatable);
// otherwise bf16 and pivot run the key-outer kernel (FP32 atomics). gproj's
// structure is chosen once when the library loads (gpu::GprojPath):
// GAUGEWATCH_GPROJ_KERNEL=key_outer runs the key-outer kernel (the
// warp-specialized one, unless GAUGEWATCH_BF16_KERNEL=key_outer) and its
// second pass at every head dim, "pair" the two-kernel pair; unset, empty or
// "auto" the default, the key-outer kernel at head dim 64, at 128 where it
// runs warp-specialized and at 256 unless GAUGEWATCH_D256_KERNEL=pair
// (gpu::GprojPath::kAuto has the measured times);
// another value warns once on stderr and keeps the default.
// GAUGEWATCH_GPROJ_PASS2_KEYS (gpu::Bf16BackwardParams::gproj_pass2_keys):
// keys per block of gproj's warp-specialized second pass; unset, empty or
// "256" the default, 256; "128" the 128-key pass.
// GAUGEWATCH_D256_KERNEL (gpu::Bf16BackwardParams::d256_key_outer): unset
// or "key_outer", bf16, pivot and gproj at head dim 256 (not deterministic;
// gproj unless GAUGEWATCH_GPROJ_KERNEL=pair) run the key-outer kernels;
// "pair", the mma.sync pair. The metrics run
// deterministic (the pair): their backends' runs are bit-repeatable.
Grads fused_bf16_backward(const AttentionCall& call, gpu::Projection projection, const at::Tensor& grad_out,
                          const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                          const at::Tensor& lse, const DeviceOffsets& offsets, const gpu::Bf16RowDiagnostics& diag,
                          cudaStream_t stream, bool deterministic = true);

// The fused FP32 backward on FP32 contiguous operands; full, or the row
// subset (slices, rows: int32 on the device) when given.
struct Fp32Subset {
  at::Tensor slices, rows;
};
Grads fused_fp32_backward(const AttentionCall& call, const at::Tensor& grad_out_f32, const at::Tensor& q_f32,
                          const at::Tensor& k_f32, const at::Tensor& v_f32, const DeviceOffsets& offsets,
                          const DeviceMask& mask, const std::optional<Fp32Subset>& subset, bool deterministic,
                          bool center_keys, cudaStream_t stream);

// Key centring (kernels/cuda/key_centring.h), two kernels and no workspace:
// (k_centred, lse_shifted, kbar) of checked operands, k_centred with k's
// strides where k is dense; lse_shifted (B, Hq, max(L, lse_out_len))
// contiguous, rows past L zero (the memory-efficient backward's padding).
std::tuple<at::Tensor, at::Tensor, at::Tensor> centred_keys(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& lse, double scale,
                                                            gpu::CentringPolicy policy, double offset_spread_ratio,
                                                            cudaStream_t stream, int64_t lse_out_len = 0);

}  // namespace gaugewatch::torch_ops
