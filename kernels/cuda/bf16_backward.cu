// Launcher of the fused BF16 attention backward: validation, workspace, the
// delta pre-pass, and dispatch on (head dim, projection) to the key-outer
// kernel (bf16_keyouter_kernel.cuh) or the kernel pair.
// Host code only (every <<<>>> is in bf16_backward_delta.cu and the launch
// template), so the CPU emulation compiles this file as it is.
// Math and layouts: kernels/cuda/bf16_backward.h; kernels:
// kernels/cuda/bf16_backward_hopper.cuh (baseline/bf16_mma_sync_kernel.cuh).
// Build: target gaugewatch_cuda (sm_90a). Run: tests/cuda/bf16_backward_test.cpp.

#include "kernels/cuda/bf16_backward.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/bf16_backward_common.cuh"
#include "kernels/cuda/grid_order.cuh"
#include "kernels/cuda/launch_checks.h"

namespace gaugewatch::gpu {

namespace bf16 {
template <int D, Projection P>
cudaError_t launch(const Args& args, Bf16KernelPair pair, cudaStream_t stream);

// The key-outer kernel and its epilogue (bf16_keyouter_launch.cuh); for
// kGproj also its second pass (warp-specialized when ws_second_pass).
template <int D, Projection P>
cudaError_t launch_keyouter(const Args& args, cudaStream_t stream, bool ws_second_pass = false);

// The warp-specialized key-outer kernel and the same epilogue
// (bf16_keyouter_ws_launch.cuh; keyouter_kernel where its TMA maps cannot be
// encoded).
template <int D, Projection P>
cudaError_t launch_keyouter_ws(const Args& args, cudaStream_t stream);

// The head-dim-256 key-outer kernel and its finish (bf16_keyouter_d256.cu;
// gproj with its second pass: bf16_keyouter_d256_gproj.cu).
cudaError_t launch_keyouter_d256(const Args& args, Projection projection, cudaStream_t stream);

// Whether encode_maps (bf16_keyouter_ws_kernel.cuh) accepts the operands.
bool keyouter_ws_maps_encodable(const Args& args, int head_dim);
// bf16_gproj_keys_ws_wide.cu: gproj_keys_ws::key_map_encodable<head_dim, 256>.
bool gproj_wide_key_map_encodable(const Args& args, int head_dim);

}  // namespace bf16

namespace {

using checks::aligned16;
using checks::invalid;
using checks::kMaxGridY;
using checks::round_up;

struct Layout {
  // The structure the layout is for (bf16_uses_key_outer, decided once per
  // call: with gproj at head dim 128 it encodes the ws kernels' TMA maps).
  bool key_outer = false;
  size_t delta = 0, row_factor = 0, pivot_key = 0, neg_lambda_q = 0, total = 0;
  // Key-outer kernel only (sizes 0 otherwise).
  size_t dq_accum = 0, dq_accum_bytes = 0, pivot_code = 0, pivot_code_bytes = 0, dk_accum = 0;
  size_t mass_accum = 0, mass_accum_bytes = 0;  // gproj
};

Layout layout_of(const Bf16BackwardParams& p) {
  const size_t rows = static_cast<size_t>(p.shape.q_rows());
  Layout w;
  w.delta = 0;
  w.row_factor = round_up(rows * sizeof(float));
  w.pivot_key = w.row_factor + round_up(rows * sizeof(float));
  w.neg_lambda_q = w.pivot_key + round_up(rows * sizeof(int32_t));
  // gproj: bf16(-lambda_i q_i) per row (BF16, rows x d), written once by the
  // dq kernel and read by every key tile of the dkdv kernel.
  const size_t lq_bytes =
      p.projection == Projection::kGproj ? rows * static_cast<size_t>(p.shape.head_dim) * 2 : 0;
  w.dq_accum = w.neg_lambda_q + round_up(lq_bytes);
  const bool key_outer = w.key_outer = bf16_uses_key_outer(p);
  const bool pivot = key_outer && p.projection == Projection::kPivot;
  const bool gproj = key_outer && p.projection == Projection::kGproj;
  const size_t d = static_cast<size_t>(p.shape.head_dim);
  w.dq_accum_bytes = key_outer ? rows * d * sizeof(float) : 0;
  w.pivot_code = w.dq_accum + round_up(w.dq_accum_bytes);
  w.pivot_code_bytes = pivot ? rows * sizeof(unsigned long long) : 0;
  w.dk_accum = w.pivot_code + round_up(w.pivot_code_bytes);
  const size_t dk_bytes = pivot || gproj ? static_cast<size_t>(p.shape.kv_elements()) * sizeof(float) : 0;
  // gproj: m_i (FP32 per row); rho_i, then lambda_i, in row_factor.
  w.mass_accum = w.dk_accum + round_up(dk_bytes);
  w.mass_accum_bytes = gproj ? rows * sizeof(float) : 0;
  w.total = w.mass_accum + round_up(w.mass_accum_bytes);
  return w;
}

}  // namespace

void Bf16BackwardParams::set_contiguous_strides() {
  const ProblemShape& s = shape;
  const OperandStrides query{s.q_heads * s.q_len * s.head_dim, s.q_len * s.head_dim, s.head_dim};
  const OperandStrides key{s.kv_heads * s.kv_len * s.head_dim, s.kv_len * s.head_dim, s.head_dim};
  q_strides = grad_out_strides = out_strides = dq_strides = query;
  k_strides = v_strides = dk_strides = dv_strides = key;
  lse_strides = LseStrides{s.q_heads * s.q_len, s.q_len};
}

Status validate(const Bf16BackwardParams& params) {
  const ProblemShape& p = params.shape;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return invalid("head_dim " + std::to_string(p.head_dim) +
                   " is not supported by the fused BF16 backward (64, 128 or 256); use backend center for other "
                   "head dims (the FP32 backward takes any on CPU tensors)");
  }
  if (p.batch < 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.q_len < 0 || p.kv_len < 0) {
    return invalid("shape must have batch, q_len, kv_len >= 0 and q_heads, kv_heads > 0");
  }
  if (Status s = checks::check_heads_and_lengths(p.q_heads, p.kv_heads, p.q_len, p.kv_len); !s.ok()) return s;
  if (p.batch * p.q_heads > kMaxGridY || p.batch * p.kv_heads > kMaxGridY) {
    return invalid("batch * heads must be at most 65535 (one grid row per batch and head)");
  }
  if (p.batch * p.kv_heads * ((p.kv_len + bf16::kKeyBlockKeys - 1) / bf16::kKeyBlockKeys) > INT32_MAX) {
    return invalid("batch * kv_heads * ceil(kv_len / 128) must be at most 2^31 - 1 (one block per 128 keys of each head)");
  }
  if (p.batch * p.q_heads * ((p.q_len + bf16::kQueryTileRows - 1) / bf16::kQueryTileRows) > INT32_MAX) {
    return invalid("batch * q_heads * ceil(q_len / 128) must be at most 2^31 - 1 (one block per 128 query rows of each head)");
  }
  const Projection proj = params.projection;
  if (proj != Projection::kNone && proj != Projection::kGproj && proj != Projection::kPivot) {
    return invalid("unknown projection");
  }
  if (params.kernel_pair != Bf16KernelPair::kHopper && params.kernel_pair != Bf16KernelPair::kMmaSyncBaseline) {
    return invalid("unknown kernel pair");
  }
  if (params.gproj_path != GprojPath::kAuto && params.gproj_path != GprojPath::kPair &&
      params.gproj_path != GprojPath::kKeyOuter) {
    return invalid("unknown gproj_path (kAuto, kPair or kKeyOuter)");
  }
  if (params.gproj_pass2_keys != 0 && params.gproj_pass2_keys != bf16::kKeyBlockKeys &&
      params.gproj_pass2_keys != bf16::kWideKeyBlockKeys) {
    return invalid("gproj_pass2_keys must be 0 (the default), 128 or 256, not " +
                   std::to_string(params.gproj_pass2_keys));
  }
  constexpr int64_t kD256Keys = bf16::kD256KeyBlockKeys;
  if (params.d256_key_outer && p.head_dim == 256 &&
      p.batch * p.kv_heads * ((p.kv_len + kD256Keys - 1) / kD256Keys) > INT32_MAX) {
    return invalid("with d256_key_outer, batch * kv_heads * ceil(kv_len / 64) must be at most 2^31 - 1 (one block "
                   "per 64 keys of each head); leave d256_key_outer off for this shape");
  }
  if (params.diagnostics.any() && proj != Projection::kNone) {
    return invalid("row diagnostics are computed by the bf16 variant (projection kNone) only");
  }
  if (p.mask.any()) {
    return invalid("the fused BF16 backward takes no attn_mask; use backend center (the stock backward on centred "
                   "keys) or fp32 for masked calls");
  }
  if (Status s = checks::check_packing(p.cu_seqlens_q, p.cu_seqlens_k, p.num_segments); !s.ok()) return s;
  const Bf16BackwardParams& t = params;
  if (p.q_rows() > 0 && (!t.q || !t.grad_out || !t.out || !t.lse || !t.dq)) {
    return invalid("q, grad_out, out, lse and dq must be non-null");
  }
  if (p.batch * p.kv_heads * p.kv_len > 0 && (!t.k || !t.v || !t.dk || !t.dv)) {
    return invalid("k, v, dk and dv must be non-null");
  }
  const void* ptrs[] = {t.q, t.k, t.v, t.out, t.grad_out, t.dq, t.dk, t.dv};
  for (const void* ptr : ptrs) {
    if (ptr != nullptr && !aligned16(ptr)) return invalid("BF16 tensors must be 16-byte aligned");
  }
  for (const OperandStrides& s : {t.q_strides, t.k_strides, t.v_strides, t.out_strides, t.grad_out_strides}) {
    if (s.batch % 8 != 0 || s.head % 8 != 0 || s.row % 8 != 0) {
      return invalid("BF16 tensor strides must be multiples of 8 elements (16-byte rows); call .contiguous()");
    }
  }
  // The outputs: two adjacent elements per 32-bit store, and no two rows at
  // one address (a zero stride is the default of OperandStrides, not a layout).
  struct Output {
    const char* name;
    OperandStrides s;
    int64_t heads, len;
  };
  const Output outputs[] = {{"dq", t.dq_strides, p.q_heads, p.q_len},
                            {"dk", t.dk_strides, p.kv_heads, p.kv_len},
                            {"dv", t.dv_strides, p.kv_heads, p.kv_len}};
  for (const Output& o : outputs) {
    const std::string strides = std::string(o.name) + " strides (batch " + std::to_string(o.s.batch) + ", head " +
                                std::to_string(o.s.head) + ", row " + std::to_string(o.s.row) + ")";
    if (o.s.batch % 2 != 0 || o.s.head % 2 != 0 || o.s.row % 2 != 0) {
      return invalid(strides + " must be even: the kernels store BF16 pairs as 32-bit words (4-byte aligned rows)");
    }
    if ((p.batch > 1 && o.s.batch == 0) || (o.heads > 1 && o.s.head == 0) || (o.len > 1 && o.s.row == 0)) {
      return invalid(strides + " are 0 along a dimension of size > 1: rows would be written over each other; "
                               "set the output's strides (set_contiguous_strides() for contiguous outputs)");
    }
  }
  return {};
}

namespace {

// The parameters' part of the kernels' argument block: operands, outputs,
// and the shape as the int the kernels index with (validate() bounds it).
bf16::Args operand_args(const Bf16BackwardParams& p) {
  const ProblemShape& sh = p.shape;
  bf16::Args a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.grad_out = p.grad_out;
  a.lse = p.lse;
  a.q_strides = p.q_strides;
  a.k_strides = p.k_strides;
  a.v_strides = p.v_strides;
  a.grad_out_strides = p.grad_out_strides;
  a.lse_strides = p.lse_strides;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.dq_strides = p.dq_strides;
  a.dk_strides = p.dk_strides;
  a.dv_strides = p.dv_strides;
  a.batch = static_cast<int>(sh.batch);
  a.hq = static_cast<int>(sh.q_heads);
  a.hkv = static_cast<int>(sh.kv_heads);
  a.group = static_cast<int>(sh.group());
  a.n = static_cast<int>(sh.q_len);
  a.m = static_cast<int>(sh.kv_len);
  a.scale = static_cast<float>(sh.scale);
  a.scale_log2 = a.scale * bf16::kLog2e;
  a.causal = static_cast<int>(sh.causal);
  a.cu_q = sh.cu_seqlens_q;
  a.cu_k = sh.cu_seqlens_k;
  a.num_segments = static_cast<int>(sh.num_segments);
  a.diag = p.diagnostics;
  return a;
}

// Whether the key-outer kernels exist at p's head dim (64 and 128; at 256
// their tiles do not fit, kernels/cuda/README.md).
bool has_key_outer_kernels(const Bf16BackwardParams& p) {
  return p.shape.head_dim == 64 || p.shape.head_dim == 128;
}

// Whether the head-dim-256 key-outer kernels run for p: d256_key_outer asks
// for them, and for gproj gproj_path is not kPair (its two passes, with dQ
// by tensor reductions, measured 0.96-0.98x the pair's time).
bool d256_key_outer(const Bf16BackwardParams& p) {
  return p.shape.head_dim == 256 && p.d256_key_outer &&
         (p.projection != Projection::kGproj || p.gproj_path != GprojPath::kPair);
}

// Whether the warp-specialized key-outer kernels can run for p: asked for,
// valid parameters, and TMA maps the driver encodes for its operands.
bool key_outer_ws_possible(const Bf16BackwardParams& p) {
  if (!p.keyouter_warp_specialized || !has_key_outer_kernels(p) || !validate(p).ok()) return false;
  return bf16::keyouter_ws_maps_encodable(operand_args(p), static_cast<int>(p.shape.head_dim));
}

}  // namespace

bool gproj_runs_key_outer(const Bf16BackwardParams& p) {
  if (p.shape.head_dim == 256) return d256_key_outer(p);
  if (!has_key_outer_kernels(p)) return false;
  switch (p.gproj_path) {
    case GprojPath::kPair: return false;
    case GprojPath::kKeyOuter: return true;
    default: return p.shape.head_dim == 64 || key_outer_ws_possible(p);
  }
}

bool bf16_uses_key_outer(const Bf16BackwardParams& p) {
  if (!has_key_outer_kernels(p) && !d256_key_outer(p)) return false;
  const bool opted_in = p.projection != Projection::kGproj || gproj_runs_key_outer(p);
  return opted_in && !p.deterministic && p.kernel_pair == Bf16KernelPair::kHopper && !p.diagnostics.any();
}

size_t bf16_backward_workspace_bytes(const Bf16BackwardParams& p) { return layout_of(p).total; }

bool bf16_uses_key_outer_ws(const Bf16BackwardParams& p) { return bf16_uses_key_outer(p) && key_outer_ws_possible(p); }

int gproj_pass2_block_keys(const Bf16BackwardParams& p) {
  if (p.projection != Projection::kGproj || !bf16_uses_key_outer(p)) return 0;
  if (p.shape.head_dim == 256) return bf16::kD256KeyBlockKeys;
  const bool wide = p.gproj_pass2_keys != bf16::kKeyBlockKeys && key_outer_ws_possible(p) &&
                    bf16::gproj_wide_key_map_encodable(operand_args(p), static_cast<int>(p.shape.head_dim));
  return wide ? bf16::kWideKeyBlockKeys : bf16::kKeyBlockKeys;
}

namespace {

// The current device's L2 size and SM count; zeros when the runtime cannot
// say (then every grid is one section of all heads).
grid_order::SectionInputs device_inputs() {
  grid_order::SectionInputs in;
  int device = 0, l2 = 0, sms = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) {
    in.l2_bytes = l2;
    in.resident = sms;
  }
  return in;
}

// The sections of the key-block and query-tile grids (grid_order.cuh):
// p.grid_section when set (< 0: one section; > 0: sections that many kv
// heads wide, on the query-tile grid the query heads of as many kv heads),
// else as wide as fill half the L2. The streams: a key block reads its kv
// head's query rows (Q and dO in BF16, lse and delta) and on the key-outer
// path adds into their FP32 dQ accumulator; a query tile reads its kv
// head's K and V (shared by the group's query heads).
void set_grid_sections(const Bf16BackwardParams& p, bool key_outer, bf16::Args& a) {
  const int64_t kv_heads = static_cast<int64_t>(a.batch) * a.hkv, q_heads = static_cast<int64_t>(a.batch) * a.hq;
  auto of_width = [&](int64_t width) {
    a.kv_sections = grid_order::sections_of_width(kv_heads, width);
    a.wide_kv_sections = a.kv_sections;
    a.q_sections = grid_order::sections_of_width(q_heads, width * a.group);
  };
  if (p.grid_section != 0) return of_width(p.grid_section > 0 ? p.grid_section : kv_heads);
  grid_order::SectionInputs in = device_inputs();
  if (in.l2_bytes <= 0) return of_width(kv_heads);
  const int64_t d = p.shape.head_dim, n = a.n, m = a.m;
  in.uneven = p.shape.causal != CausalMode::kNone;
  in.heads = kv_heads;
  in.blocks = (m + bf16::kKeyBlockKeys - 1) / bf16::kKeyBlockKeys;
  in.bytes_per_head = a.group * n * ((key_outer ? 8 : 4) * d + 8);
  a.kv_sections = grid_order::section_count(in);
  in.blocks = (m + bf16::kWideKeyBlockKeys - 1) / bf16::kWideKeyBlockKeys;  // the same stream, half the blocks
  a.wide_kv_sections = grid_order::section_count(in);
  in.heads = q_heads;
  in.blocks = (n + bf16::kQueryTileRows - 1) / bf16::kQueryTileRows;
  in.bytes_per_head = (4 * m * d + a.group - 1) / a.group;
  a.q_sections = grid_order::section_count(in);
}

// The kernels' argument block: operand_args, the grids' sections and the
// workspace's arrays.
bf16::Args make_args(const Bf16BackwardParams& p, char* ws, const Layout& w) {
  bf16::Args a = operand_args(p);
  set_grid_sections(p, w.key_outer, a);
  // 0 (the default) and 256: 256-key blocks; 128: the 128-key pass.
  a.gproj_pass2_keys = p.gproj_pass2_keys == bf16::kKeyBlockKeys ? bf16::kKeyBlockKeys : bf16::kWideKeyBlockKeys;
  a.delta = reinterpret_cast<float*>(ws + w.delta);
  a.row_factor = reinterpret_cast<float*>(ws + w.row_factor);
  a.pivot_key = reinterpret_cast<int32_t*>(ws + w.pivot_key);
  a.neg_lambda_q = reinterpret_cast<uint16_t*>(ws + w.neg_lambda_q);
  a.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum);
  a.pivot_code = reinterpret_cast<unsigned long long*>(ws + w.pivot_code);
  a.dk_accum = reinterpret_cast<float*>(ws + w.dk_accum);
  a.mass_accum = reinterpret_cast<float*>(ws + w.mass_accum);
  return a;
}

template <int D>
cudaError_t launch_projection(const bf16::Args& a, Projection projection, Bf16KernelPair pair, cudaStream_t stream) {
  switch (projection) {
    case Projection::kGproj: return bf16::launch<D, Projection::kGproj>(a, pair, stream);
    case Projection::kPivot: return bf16::launch<D, Projection::kPivot>(a, pair, stream);
    default: return bf16::launch<D, Projection::kNone>(a, pair, stream);
  }
}

// The key-outer kernel's zeroed accumulators: dQ, for pivot and gproj rho
// (in row_factor), for pivot the pivot codes, for gproj m.
cudaError_t zero_key_outer_accumulators(const Bf16BackwardParams& p, char* ws, const Layout& w,
                                        cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(ws + w.dq_accum, 0, w.dq_accum_bytes, stream);
  if (err == cudaSuccess && p.projection != Projection::kNone) {
    err = cudaMemsetAsync(ws + w.row_factor, 0, static_cast<size_t>(p.shape.q_rows()) * sizeof(float), stream);
  }
  if (err == cudaSuccess && p.projection == Projection::kPivot) {
    err = cudaMemsetAsync(ws + w.pivot_code, 0, w.pivot_code_bytes, stream);
  }
  if (err == cudaSuccess && p.projection == Projection::kGproj) {
    err = cudaMemsetAsync(ws + w.mass_accum, 0, w.mass_accum_bytes, stream);
  }
  return err;
}

template <int D>
cudaError_t launch_key_outer(const bf16::Args& a, Projection projection, bool warp_specialized,
                             cudaStream_t stream) {
  if (warp_specialized) {
    switch (projection) {
      case Projection::kPivot: return bf16::launch_keyouter_ws<D, Projection::kPivot>(a, stream);
      case Projection::kGproj: return bf16::launch_keyouter_ws<D, Projection::kGproj>(a, stream);
      default: return bf16::launch_keyouter_ws<D, Projection::kNone>(a, stream);
    }
  }
  switch (projection) {
    case Projection::kPivot: return bf16::launch_keyouter<D, Projection::kPivot>(a, stream);
    case Projection::kGproj: return bf16::launch_keyouter<D, Projection::kGproj>(a, stream);
    default: return bf16::launch_keyouter<D, Projection::kNone>(a, stream);
  }
}

}  // namespace

Status bf16_attention_backward(const Bf16BackwardParams& p, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  Status st = validate(p);
  if (!st.ok()) return st;
  const Layout w = layout_of(p);
  st = checks::check_workspace(workspace, workspace_bytes, w.total);
  if (!st.ok()) return st;
  auto* ws = static_cast<char*>(workspace);
  const bf16::Args a = make_args(p, ws, w);

  const int64_t rows = p.shape.q_rows();
  if (rows > 0) {
    bf16::DeltaArgs da{};
    da.grad_out = p.grad_out;
    da.out = p.out;
    da.grad_out_strides = p.grad_out_strides;
    da.out_strides = p.out_strides;
    da.delta = reinterpret_cast<float*>(ws + w.delta);
    da.hq = a.hq;
    da.n = a.n;
    da.d = static_cast<int>(p.shape.head_dim);
    da.rows = rows;
    const cudaError_t err = bf16::launch_delta(da, stream);
    if (err != cudaSuccess) return checks::cuda_failure("delta pre-pass launch", err);
  }

  cudaError_t err = cudaSuccess;
  if (w.key_outer) {
    err = zero_key_outer_accumulators(p, ws, w, stream);
    if (err != cudaSuccess) return checks::cuda_failure("key-outer accumulators", err);
    const bool specialized = p.keyouter_warp_specialized;
    switch (p.shape.head_dim) {
      case 64: err = launch_key_outer<64>(a, p.projection, specialized, stream); break;
      case 128: err = launch_key_outer<128>(a, p.projection, specialized, stream); break;
      default: err = bf16::launch_keyouter_d256(a, p.projection, stream); break;  // d256_key_outer
    }
  } else {
    switch (p.shape.head_dim) {
      case 64: err = launch_projection<64>(a, p.projection, p.kernel_pair, stream); break;
      case 128: err = launch_projection<128>(a, p.projection, p.kernel_pair, stream); break;
      default: err = launch_projection<256>(a, p.projection, p.kernel_pair, stream); break;
    }
  }
  if (err != cudaSuccess) return checks::cuda_failure("bf16 backward launch", err);
  return {};
}

}  // namespace gaugewatch::gpu
