// Filling the kernels' parameter blocks from checked tensors (cuda_launch.h).

#include "kernels/torch/cuda_launch.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "kernels/torch/stride_order.h"

namespace gaugewatch::torch_ops {
namespace {

// GAUGEWATCH_BF16_KERNEL: "mma_sync" runs the mma.sync kernel pair
// (Bf16KernelPair::kMmaSyncBaseline); "key_outer" runs bf16 and pivot's
// key-outer path (and the opt-in key-outer gproj's first pass) on the
// key-outer kernel without warp specialization (the
// measured baseline of the default, Bf16BackwardParams::
// keyouter_warp_specialized = false); unset, empty or "ws" keeps the
// defaults (the warp-specialized kernel). Any other value keeps them and says
// so once, on stderr (a static initializer: it must not throw).
struct Bf16KernelChoice {
  gpu::Bf16KernelPair pair = gpu::Bf16KernelPair::kHopper;
  bool warp_specialized = true;
};

Bf16KernelChoice bf16_kernel_from_environment() {
  Bf16KernelChoice choice;
  const char* env = std::getenv("GAUGEWATCH_BF16_KERNEL");
  if (env == nullptr || *env == '\0') return choice;
  const std::string_view value(env);
  if (value == "mma_sync") {
    choice.pair = gpu::Bf16KernelPair::kMmaSyncBaseline;
  } else if (value == "key_outer") {
    choice.warp_specialized = false;
  } else if (value != "ws") {
    std::fprintf(stderr,
                 "[gaugewatch] GAUGEWATCH_BF16_KERNEL=%s is not one of ws, key_outer, mma_sync: the default kernels "
                 "run\n",
                 env);
  }
  return choice;
}

const Bf16KernelChoice kBf16Kernel = bf16_kernel_from_environment();

// GAUGEWATCH_GPROJ_KERNEL (Bf16BackwardParams::gproj_path): "key_outer"
// runs gproj on the key-outer kernel (warp-specialized as bf16's,
// GAUGEWATCH_BF16_KERNEL above) at every head dim, "pair" on the two-kernel
// pair; unset, empty or "auto" the default (GprojPath::kAuto): the
// key-outer kernel at head dim 64, at 128 where it runs warp-specialized
// and at 256 (GAUGEWATCH_D256_KERNEL below; the pair otherwise). Any other
// value keeps the default and says so once, on stderr (this runs in a static
// initializer: it must not throw).
gpu::GprojPath gproj_path_from_environment() {
  const char* env = std::getenv("GAUGEWATCH_GPROJ_KERNEL");
  if (env == nullptr || *env == '\0') return gpu::GprojPath::kAuto;
  const std::string_view value(env);
  if (value == "key_outer") return gpu::GprojPath::kKeyOuter;
  if (value == "pair") return gpu::GprojPath::kPair;
  if (value != "auto") {
    std::fprintf(stderr,
                 "[gaugewatch] GAUGEWATCH_GPROJ_KERNEL=%s is not one of auto, key_outer, pair: gproj runs its "
                 "default (key-outer, at head dim 128 where it runs warp-specialized)\n",
                 env);
  }
  return gpu::GprojPath::kAuto;
}

const gpu::GprojPath kGprojPath = gproj_path_from_environment();

// GAUGEWATCH_GRID_SECTION (Bf16BackwardParams::grid_section): the fused
// BF16 backward's grid order. Unset, empty or "auto": sections of heads
// sized to the device's L2 (the default); "all": one section of all heads
// (the order before sections, the measured baseline); a positive integer:
// that many kv heads per section. Any other value keeps the default and
// says so once, on stderr (a static initializer: it must not throw).
int grid_section_from_environment() {
  const char* env = std::getenv("GAUGEWATCH_GRID_SECTION");
  if (env == nullptr || *env == '\0') return 0;
  const std::string_view value(env);
  if (value == "auto") return 0;
  if (value == "all") return -1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (end != env && *end == '\0' && n > 0 && n <= (1L << 30)) return static_cast<int>(n);
  std::fprintf(stderr,
               "[gaugewatch] GAUGEWATCH_GRID_SECTION=%s is not auto, all or a positive number of kv heads: the "
               "default grid order (sections sized to the L2) runs\n",
               env);
  return 0;
}

const int kGridSection = grid_section_from_environment();

// GAUGEWATCH_GPROJ_PASS2_KEYS (Bf16BackwardParams::gproj_pass2_keys): keys
// per block of gproj's warp-specialized second pass (head dims 64 and 128).
// Unset, empty or "256": 256 (the default); "128": the 128-key pass (the
// measured baseline). Any other value keeps the default and says so once,
// on stderr (a static initializer: it must not throw).
int gproj_pass2_keys_from_environment() {
  const char* env = std::getenv("GAUGEWATCH_GPROJ_PASS2_KEYS");
  if (env == nullptr || *env == '\0') return 0;
  const std::string_view value(env);
  if (value == "128") return 128;
  if (value == "256") return 256;
  std::fprintf(stderr,
               "[gaugewatch] GAUGEWATCH_GPROJ_PASS2_KEYS=%s is not 128 or 256: gproj's second pass runs its default "
               "(256-key blocks)\n",
               env);
  return 0;
}

const int kGprojPass2Keys = gproj_pass2_keys_from_environment();

// GAUGEWATCH_GPROJ_PASS2_KEYS set to 128 or 256 beside a kernel choice under
// which no call runs the warp-specialized second pass (the only one whose
// block size it chooses) says so once, on stderr, rather than being ignored
// without a word. Per call, deterministic=True and head dim 256 run the pair
// as documented.
const bool kGprojPass2KeysChecked = [] {
  if (kGprojPass2Keys == 0) return true;
  const char* why = kBf16Kernel.pair == gpu::Bf16KernelPair::kMmaSyncBaseline ? "GAUGEWATCH_BF16_KERNEL=mma_sync"
                    : !kBf16Kernel.warp_specialized                             ? "GAUGEWATCH_BF16_KERNEL=key_outer"
                    : kGprojPath == gpu::GprojPath::kPair                       ? "GAUGEWATCH_GPROJ_KERNEL=pair"
                                                                                : nullptr;
  if (why != nullptr) {
    std::fprintf(stderr,
                 "[gaugewatch] GAUGEWATCH_GPROJ_PASS2_KEYS=%d has no effect with %s: it sets the block size of "
                 "gproj's warp-specialized second pass, which the default kernels run\n",
                 kGprojPass2Keys, why);
  }
  return true;
}();

// GAUGEWATCH_D256_KERNEL (Bf16BackwardParams::d256_key_outer): the kernels
// at head dim 256 without bitwise determinism. Unset, empty or "key_outer"
// (the default): bf16, pivot and gproj (unless GAUGEWATCH_GPROJ_KERNEL=pair)
// on the key-outer kernels on the tensor cores; "pair": the
// mma.sync pair for all three. Any other value keeps the default and says
// so once, on stderr; beside GAUGEWATCH_BF16_KERNEL=mma_sync, under which
// it never runs, an explicit "key_outer" says that once too (static
// initializers: they must not throw).
bool d256_key_outer_from_environment() {
  const char* env = std::getenv("GAUGEWATCH_D256_KERNEL");
  if (env == nullptr || *env == '\0') return true;
  const std::string_view value(env);
  if (value == "key_outer") {
    if (kBf16Kernel.pair == gpu::Bf16KernelPair::kMmaSyncBaseline) {
      std::fprintf(stderr,
                   "[gaugewatch] GAUGEWATCH_D256_KERNEL=key_outer has no effect with GAUGEWATCH_BF16_KERNEL=mma_sync: "
                   "every call runs the mma.sync pair\n");
    }
    return true;
  }
  if (value == "pair") return false;
  std::fprintf(stderr,
               "[gaugewatch] GAUGEWATCH_D256_KERNEL=%s is not one of pair, key_outer: head dim 256 runs its default "
               "(key_outer)\n",
               env);
  return true;
}

const bool kD256KeyOuter = d256_key_outer_from_environment();

at::Tensor checked_offsets(const at::Tensor& t, int64_t length, const char* name, const at::Tensor& q) {
  if (t.device().is_cpu()) {
    const at::Tensor l = t.to(at::kLong).contiguous();
    const int64_t* p = l.data_ptr<int64_t>();
    const int64_t n = l.numel();
    TORCH_CHECK(p[0] == 0 && p[n - 1] == length, "gaugewatch: ", name, " must start at 0 and end at ", length,
                ", got ", p[0], " .. ", p[n - 1]);
    for (int64_t i = 1; i < n; ++i) {
      TORCH_CHECK(p[i] >= p[i - 1], "gaugewatch: ", name, " must be non-decreasing");
    }
  }
  return t.to(q.device(), at::kInt).contiguous();
}

// Stride of dim i of a (B, H, L, d) tensor as the kernels take it: a
// dimension of size 1 is never stepped along, so its stride is irrelevant (0).
int64_t kernel_stride(const at::Tensor& x, int i) { return x.size(i) > 1 ? x.stride(i) : int64_t{0}; }

// Element strides (batch, head, row) of a (B, H, L, d) BF16 operand, taken as
// it is when its rows are contiguous and 16-byte aligned (SDPA's transposed
// (B, L, H, d) views qualify), otherwise from a contiguous copy.
at::Tensor kernel_operand(const at::Tensor& t, gpu::OperandStrides& strides) {
  bool usable = (t.size(3) <= 1 || t.stride(3) == 1) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) usable = usable && kernel_stride(t, i) % 8 == 0;
  const at::Tensor u = usable ? t : t.contiguous();
  strides = gpu::OperandStrides{kernel_stride(u, 0), kernel_stride(u, 1), kernel_stride(u, 2)};
  return u;
}

// A (B, H, L, d) BF16 gradient of `input`, dense in input's stride order
// (stride_order.h: rows contiguous), and its strides for the kernels, which
// write it in place.
at::Tensor kernel_output(const at::Tensor& input, gpu::OperandStrides& strides) {
  at::Tensor t = empty_in_stride_order(input, input.options());
  TORCH_INTERNAL_ASSERT(t.size(3) <= 1 || t.stride(3) == 1, "gaugewatch: gradient rows must be contiguous");
  strides = gpu::OperandStrides{kernel_stride(t, 0), kernel_stride(t, 1), kernel_stride(t, 2)};
  return t;
}

at::Tensor workspace_of(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

}  // namespace

DeviceMask device_mask(const std::optional<at::Tensor>& attn_mask) {
  DeviceMask d;
  if (!attn_mask.has_value()) return d;
  at::Tensor m = *attn_mask;
  while (m.dim() < 4) m = m.unsqueeze(0);
  // One copy of each broadcast row: a dtype conversion then never materializes
  // the (B, Hq, N, M) broadcast.
  for (int64_t i = 0; i < 4; ++i) {
    if (m.size(i) > 1 && m.stride(i) == 0) m = m.narrow(i, 0, 1);
  }
  const bool flags = m.scalar_type() == at::kBool;
  if (!flags && m.scalar_type() != at::kFloat) m = m.to(at::kFloat);
  d.storage = m;
  d.view.kind = flags ? gpu::MaskKind::kBool : gpu::MaskKind::kBias;
  d.view.data = m.data_ptr();
  for (int64_t i = 0; i < 4; ++i) d.view.strides[i] = m.size(i) > 1 ? m.stride(i) : 0;
  return d;
}

gpu::ProblemShape problem_shape(const AttentionCall& call, const DeviceOffsets& offsets, const DeviceMask& mask) {
  const bool packed = offsets.q.defined();
  gpu::ProblemShape shape =
      gpu::problem_shape(call.shape, call.scale, call.causal, packed ? offsets.q.data_ptr<int32_t>() : nullptr,
                         packed ? offsets.k.data_ptr<int32_t>() : nullptr, offsets.segments());
  shape.mask = mask.view;
  return shape;
}

gpu::Bf16KernelPair bf16_kernel_pair() { return kBf16Kernel.pair; }

DeviceOffsets device_offsets(const AttentionCall& call, const std::optional<at::Tensor>& cu_seqlens_q,
                             const std::optional<at::Tensor>& cu_seqlens_k, const at::Tensor& q) {
  DeviceOffsets d;
  if (call.packed) {
    d.q = checked_offsets(*cu_seqlens_q, call.shape.q_len, "cu_seqlens_q", q);
    d.k = checked_offsets(*cu_seqlens_k, call.shape.kv_len, "cu_seqlens_k", q);
  }
  return d;
}

Grads fused_bf16_backward(const AttentionCall& call, gpu::Projection projection, const at::Tensor& grad_out,
                          const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                          const at::Tensor& lse, const DeviceOffsets& offsets, const gpu::Bf16RowDiagnostics& diag,
                          cudaStream_t stream, bool deterministic) {
  gpu::Bf16BackwardParams p;
  const at::Tensor qk = kernel_operand(q, p.q_strides);
  const at::Tensor kk = kernel_operand(k, p.k_strides);
  const at::Tensor vk = kernel_operand(v, p.v_strides);
  const at::Tensor ok = kernel_operand(out, p.out_strides);
  const at::Tensor gk = kernel_operand(grad_out, p.grad_out_strides);
  const at::Tensor lk = lse.stride(2) == 1 ? lse : lse.contiguous();
  p.lse_strides = gpu::LseStrides{lk.stride(0), lk.stride(1)};
  p.q = static_cast<const uint16_t*>(qk.data_ptr());
  p.k = static_cast<const uint16_t*>(kk.data_ptr());
  p.v = static_cast<const uint16_t*>(vk.data_ptr());
  p.out = static_cast<const uint16_t*>(ok.data_ptr());
  p.grad_out = static_cast<const uint16_t*>(gk.data_ptr());
  p.lse = lk.data_ptr<float>();
  // The gradients in the layout attention_backward returns (stride_order.h),
  // written by the kernels at their strides: no copy after the backward.
  const at::Tensor dq = kernel_output(q, p.dq_strides);
  const at::Tensor dk = kernel_output(k, p.dk_strides);
  const at::Tensor dv = kernel_output(v, p.dv_strides);
  p.dq = static_cast<uint16_t*>(dq.data_ptr());
  p.dk = static_cast<uint16_t*>(dk.data_ptr());
  p.dv = static_cast<uint16_t*>(dv.data_ptr());
  p.shape = problem_shape(call, offsets);
  p.projection = projection;
  p.kernel_pair = kBf16Kernel.pair;
  p.keyouter_warp_specialized = kBf16Kernel.warp_specialized;
  p.deterministic = deterministic;
  p.gproj_path = kGprojPath;
  p.grid_section = kGridSection;
  p.gproj_pass2_keys = kGprojPass2Keys;
  p.d256_key_outer = kD256KeyOuter;
  p.diagnostics = diag;
  const size_t bytes = gpu::bf16_backward_workspace_bytes(p);
  const at::Tensor workspace = workspace_of(q, bytes);
  const gpu::Status status = gpu::bf16_attention_backward(p, workspace.data_ptr(), bytes, stream);
  TORCH_CHECK(status.ok(), "gaugewatch: CUDA fused BF16 backward failed: ", status.message);
  return {dq, dk, dv};
}

Grads fused_fp32_backward(const AttentionCall& call, const at::Tensor& grad_out_f32, const at::Tensor& q_f32,
                          const at::Tensor& k_f32, const at::Tensor& v_f32, const DeviceOffsets& offsets,
                          const DeviceMask& mask, const std::optional<Fp32Subset>& subset, bool deterministic,
                          bool center_keys, cudaStream_t stream) {
  gpu::Fp32BackwardParams p;
  p.q = q_f32.data_ptr<float>();
  p.k = k_f32.data_ptr<float>();
  p.v = v_f32.data_ptr<float>();
  p.grad_out = grad_out_f32.data_ptr<float>();
  p.shape = problem_shape(call, offsets, mask);
  const auto options = q_f32.options();
  at::Tensor dq;
  if (subset.has_value()) {
    p.slices = subset->slices.data_ptr<int32_t>();
    p.num_slices = subset->slices.numel();
    p.rows = subset->rows.data_ptr<int32_t>();
    p.num_rows = subset->rows.numel();
    dq = at::empty({p.num_slices, p.num_rows, call.shape.head_dim}, options);
  } else {
    dq = at::empty(q_f32.sizes(), options);
  }
  at::Tensor dk = at::empty(k_f32.sizes(), options);
  at::Tensor dv = at::empty(k_f32.sizes(), options);
  p.dq = dq.data_ptr<float>();
  p.dk = dk.data_ptr<float>();
  p.dv = dv.data_ptr<float>();
  p.center_keys = center_keys;
  p.deterministic = deterministic;
  const size_t bytes = gpu::fp32_backward_workspace_bytes(p);
  const at::Tensor workspace = workspace_of(q_f32, bytes);
  const gpu::Status status = gpu::fp32_attention_backward(p, workspace.data_ptr(), bytes, stream);
  TORCH_CHECK(status.ok(), "gaugewatch: CUDA fp32 backward failed: ", status.message);
  return {dq, dk, dv};
}

namespace {

gpu::ElementType element_type(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return gpu::ElementType::kBf16;
    case at::kHalf: return gpu::ElementType::kFp16;
    default: return gpu::ElementType::kFp32;
  }
}

// Element strides of a (B, H, L, d) tensor whose last dim is contiguous.
gpu::OperandStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(3) <= 1 || t.stride(3) == 1 ? t : t.contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> centred_keys(const at::Tensor& q_arg, const at::Tensor& k_arg,
                                                            const at::Tensor& lse, double scale,
                                                            gpu::CentringPolicy policy, double offset_spread_ratio,
                                                            cudaStream_t stream, int64_t lse_out_len) {
  const at::Tensor q = last_dim_contiguous(q_arg), k = last_dim_contiguous(k_arg);
  const at::Tensor k_centred = empty_in_stride_order(k, k.options());
  const int64_t out_len = lse_out_len > lse.size(2) ? lse_out_len : lse.size(2);
  at::Tensor lse_shifted = at::empty({lse.size(0), lse.size(1), out_len}, lse.options());
  at::Tensor kbar = at::empty({k.size(0), k.size(1), k.size(3)}, k.options());
  gpu::KeyCentringParams p;
  p.shape.batch = q.size(0);
  p.shape.q_heads = q.size(1);
  p.shape.q_len = q.size(2);
  p.shape.head_dim = q.size(3);
  p.shape.kv_heads = k.size(1);
  p.shape.kv_len = k.size(2);
  p.shape.scale = scale;
  p.dtype = element_type(k.scalar_type());
  p.policy = policy;
  p.offset_spread_ratio = offset_spread_ratio;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  for (int i = 0; i < 3; ++i) p.lse_strides[i] = lse.stride(i);
  p.lse_len = lse.size(2);
  p.k_centred = k_centred.data_ptr();
  p.k_centred_strides = strides_of(k_centred);
  p.lse_shifted = lse_shifted.data_ptr<float>();
  p.lse_shifted_len = out_len;
  p.kbar = kbar.data_ptr();
  const gpu::Status status = gpu::center_keys(p, stream);
  TORCH_CHECK(status.ok(), "gaugewatch: CUDA center_keys failed: ", status.message);
  return {k_centred, lse_shifted, kbar};
}

}  // namespace gaugewatch::torch_ops
