#include "hooks/audit_capture.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "audit/operands.h"
#include "hooks/log.h"

namespace gaugewatch::hooks {
namespace {

std::vector<float> floats(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

std::uint64_t g_capture_bytes = 0;  // auditor thread only
std::uint64_t g_capture_files = 0;

}  // namespace

void write_capture(const Job& job) {
  const HookConfig& config = runtime().config();
  const Operands& w = job.whole;
  const std::uint64_t bytes = static_cast<std::uint64_t>(
      (w.q.numel() + w.k.numel() + w.v.numel() + w.out.numel() + w.grad_out.numel()) * 2 + w.lse.numel() * 4 + 4096);
  if (g_capture_bytes + bytes > config.capture_max_bytes) {
    log_line("capture of layer " + std::to_string(job.plan.layer) + " skipped: " + std::to_string(bytes) +
             " bytes would pass GAUGEWATCH_CAPTURE_MAX_BYTES (" + std::to_string(config.capture_max_bytes) + ")");
    return;
  }
  audit::CapturedOperands c;
  auto& in = c.inputs;
  in.shape.batch = w.q.size(0);
  in.shape.q_heads = w.q.size(1);
  in.shape.kv_heads = w.k.size(1);
  in.shape.q_len = w.q.size(2);
  in.shape.kv_len = w.k.size(2);
  in.shape.head_dim = w.q.size(3);
  in.scale = job.scale.value_or(1.0 / std::sqrt(static_cast<double>(w.q.size(3))));
  in.causal = job.is_causal ? reference::CausalMode::kTopLeft : reference::CausalMode::kNone;
  in.q = floats(w.q);
  in.k = floats(w.k);
  in.v = floats(w.v);
  in.grad_out = floats(w.grad_out);
  c.saved.out = floats(w.out);
  c.saved.lse = floats(w.lse);
  std::filesystem::create_directories(config.capture_dir);
  const std::string path = config.capture_dir + "/" + config.run_id + "-rank" + std::to_string(config.rank) +
                           "-layer" + std::to_string(job.plan.layer) + "-step" + std::to_string(job.plan.step) +
                           "-" + std::to_string(g_capture_files++) + ".safetensors";
  audit::save_operands(path, c);
  g_capture_bytes += bytes;
  log_line("captured layer " + std::to_string(job.plan.layer) + " step " + std::to_string(job.plan.step) +
           " operands to " + path);
}

}  // namespace gaugewatch::hooks
