#include "audit/operands.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "audit/safetensors.h"

namespace gaugewatch::audit {

namespace {

using reference::AttentionShape;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ")";
  return out.str();
}

// Returns a pointer, not a reference: GCC 13's -Wdangling-reference flags a
// reference returned from a function taking a temporary-looking argument.
const SafetensorsTensor* require(const SafetensorsFile& file, const std::string& path,
                                 const std::string& name, const std::string& dtype, size_t rank) {
  const auto it = file.tensors.find(name);
  if (it == file.tensors.end()) {
    throw std::runtime_error(path + ": missing tensor '" + name +
                             "'; a capture holds q, k, v, out, lse and grad_out");
  }
  const SafetensorsTensor& t = it->second;
  if (t.dtype != dtype) {
    throw std::runtime_error(path + ": tensor '" + name + "' is " + t.dtype + ", expected " + dtype +
                             (dtype == "BF16" ? " (the operands a BF16 kernel multiplies; convert with "
                                                ".to(torch.bfloat16))"
                                              : " (SDPA's flash logsumexp is float32)"));
  }
  if (t.shape.size() != rank) {
    throw std::runtime_error(path + ": tensor '" + name + "' has shape " + shape_text(t.shape) +
                             ", expected " + std::to_string(rank) + " dimensions");
  }
  return &t;
}

void expect_shape(const std::string& path, const std::string& name, const SafetensorsTensor& t,
                  const std::vector<int64_t>& expected) {
  if (t.shape != expected) {
    throw std::runtime_error(path + ": tensor '" + name + "' has shape " + shape_text(t.shape) +
                             ", expected " + shape_text(expected) + " to match q, k and v");
  }
}

// attn_mask: BOOL (true = takes part) becomes 0 / -inf, a floating mask is the bias.
reference::AttentionBias load_bias(const std::string& path, const SafetensorsTensor& t) {
  if (t.shape.empty() || t.shape.size() > 4) {
    throw std::runtime_error(path + ": tensor 'attn_mask' has shape " + shape_text(t.shape) +
                             ", expected 1 to 4 dimensions broadcastable to (B, Hq, N, M)");
  }
  reference::AttentionBias bias;
  const size_t lead = 4 - t.shape.size();
  for (size_t i = 0; i < t.shape.size(); ++i) bias.sizes[lead + i] = t.shape[i];
  if (t.dtype == "BOOL") {
    bias.values.reserve(t.bytes.size());
    for (uint8_t takes_part : t.bytes) {
      bias.values.push_back(takes_part != 0 ? 0.0f : -std::numeric_limits<float>::infinity());
    }
    return bias;
  }
  try {
    bias.values = tensor_to_float(t);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": tensor 'attn_mask' must be BOOL or floating: " + e.what());
  }
  return bias;
}

}  // namespace

CapturedOperands load_operands(const std::string& path) {
  const SafetensorsFile file = read_safetensors(path);
  const SafetensorsTensor& q = *require(file, path, "q", "BF16", 4);
  const SafetensorsTensor& k = *require(file, path, "k", "BF16", 4);
  const SafetensorsTensor& v = *require(file, path, "v", "BF16", 4);
  const SafetensorsTensor& out = *require(file, path, "out", "BF16", 4);
  const SafetensorsTensor& grad_out = *require(file, path, "grad_out", "BF16", 4);
  const SafetensorsTensor& lse = *require(file, path, "lse", "F32", 3);

  CapturedOperands ops;
  auto& in = ops.inputs;
  in.shape = AttentionShape{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  expect_shape(path, "k", k, {q.shape[0], k.shape[1], k.shape[2], q.shape[3]});
  expect_shape(path, "v", v, k.shape);
  expect_shape(path, "out", out, q.shape);
  expect_shape(path, "grad_out", grad_out, q.shape);
  expect_shape(path, "lse", lse, {q.shape[0], q.shape[1], q.shape[2]});
  if (in.shape.q_heads % in.shape.kv_heads != 0) {
    throw std::runtime_error(path + ": key/value heads (" + std::to_string(in.shape.kv_heads) +
                             ") must divide query heads (" + std::to_string(in.shape.q_heads) + ")");
  }
  in.q = tensor_to_float(q);
  in.k = tensor_to_float(k);
  in.v = tensor_to_float(v);
  in.grad_out = tensor_to_float(grad_out);
  ops.saved.out = tensor_to_float(out);
  ops.saved.lse = tensor_to_float(lse);

  const auto causal = file.metadata.find("causal");
  try {
    in.causal = causal == file.metadata.end() ? reference::CausalMode::kNone
                                              : reference::parse_causal_mode(causal->second);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": metadata 'causal': " + e.what());
  }
  in.scale = 1.0 / std::sqrt(static_cast<double>(in.shape.head_dim));
  if (const auto scale = file.metadata.find("scale"); scale != file.metadata.end()) {
    std::istringstream parse(scale->second);
    double value = 0.0;
    if (!(parse >> value) || !std::isfinite(value)) {
      throw std::runtime_error(path + ": metadata 'scale' = '" + scale->second + "' is not a finite number");
    }
    in.scale = value;
  }
  const bool has_q = file.tensors.count("cu_seqlens_q") > 0;
  const bool has_k = file.tensors.count("cu_seqlens_k") > 0;
  if (has_q != has_k) throw std::runtime_error(path + ": packed captures need both cu_seqlens_q and cu_seqlens_k");
  if (has_q) {
    try {
      in.cu_seqlens_q = tensor_to_int64(file.tensors.at("cu_seqlens_q"));
      in.cu_seqlens_k = tensor_to_int64(file.tensors.at("cu_seqlens_k"));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(path + ": cu_seqlens: " + e.what());
    }
  }
  if (const auto mask = file.tensors.find("attn_mask"); mask != file.tensors.end()) {
    in.bias = load_bias(path, mask->second);
  }
  try {
    in.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return ops;
}

void save_operands(const std::string& path, const CapturedOperands& ops) {
  const auto& in = ops.inputs;
  const auto& s = in.shape;
  SafetensorsFile file;
  const std::vector<int64_t> q_shape{s.batch, s.q_heads, s.q_len, s.head_dim};
  const std::vector<int64_t> kv_shape{s.batch, s.kv_heads, s.kv_len, s.head_dim};
  file.tensors["q"] = make_bf16_tensor(in.q, q_shape);
  file.tensors["k"] = make_bf16_tensor(in.k, kv_shape);
  file.tensors["v"] = make_bf16_tensor(in.v, kv_shape);
  file.tensors["grad_out"] = make_bf16_tensor(in.grad_out, q_shape);
  file.tensors["out"] = make_bf16_tensor(ops.saved.out, q_shape);
  file.tensors["lse"] = make_f32_tensor(ops.saved.lse, {s.batch, s.q_heads, s.q_len});
  if (in.packed()) {
    const auto segments = static_cast<int64_t>(in.cu_seqlens_q.size());
    file.tensors["cu_seqlens_q"] = make_i64_tensor(in.cu_seqlens_q, {segments});
    file.tensors["cu_seqlens_k"] = make_i64_tensor(in.cu_seqlens_k, {segments});
  }
  if (!in.bias.empty()) {
    const auto& z = in.bias.sizes;
    file.tensors["attn_mask"] = make_f32_tensor(in.bias.values, {z[0], z[1], z[2], z[3]});
  }
  file.metadata["causal"] = std::string(reference::to_string(in.causal));
  std::ostringstream scale;
  scale.precision(17);
  scale << in.scale;
  file.metadata["scale"] = scale.str();
  file.metadata["format"] = "gaugewatch.capture.v1";
  write_safetensors(path, file);
}

}  // namespace gaugewatch::audit
