// A libtorch C++ trainer monitored by libgaugewatch_hooks (linked): a small
// causal self-attention model in bfloat16 on the CPU, layers named with the
// C++ API (gaugewatch::hooks::LayerScope). Prints {"step": i, "loss": x} per
// step, then {"done": true, "stats": <hooks stats>}.
//
//   hooks_cpp_trainer <steps> [<sleep ms per step>]

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "hooks/gaugewatch_hooks.h"

namespace {

constexpr int64_t kVocab = 32, kDim = 64, kHeads = 4, kSeq = 32, kBatch = 8, kLayers = 3;

struct Block {
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int sleep_ms = argc > 2 ? std::atoi(argv[2]) : 0;
  torch::manual_seed(0);
  at::set_num_threads(1);
  torch::nn::Embedding embed(kVocab, kDim);
  torch::nn::Linear head(kDim, kVocab);
  std::vector<Block> blocks(kLayers);
  std::vector<torch::Tensor> params;
  for (auto& b : blocks) {
    b.qkv = torch::nn::Linear(kDim, 3 * kDim);
    b.proj = torch::nn::Linear(kDim, kDim);
    b.norm = torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim}));
    for (auto* m : {b.qkv.ptr().get(), b.proj.ptr().get()}) m->to(torch::kBFloat16);
    b.norm->to(torch::kBFloat16);
    for (auto& p : b.qkv->parameters()) params.push_back(p);
    for (auto& p : b.proj->parameters()) params.push_back(p);
    for (auto& p : b.norm->parameters()) params.push_back(p);
  }
  embed->to(torch::kBFloat16);
  head->to(torch::kBFloat16);
  for (auto& p : embed->parameters()) params.push_back(p);
  for (auto& p : head->parameters()) params.push_back(p);
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(3e-3));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);

  for (int step = 0; step < steps; ++step) {
    const auto start = torch::randint(0, kVocab, {kBatch, 1}, gen, torch::kLong);
    const auto seqs = (start + torch::arange(kSeq + 1)).remainder(kVocab);
    const auto x_idx = seqs.narrow(1, 0, kSeq), y_idx = seqs.narrow(1, 1, kSeq);
    optimizer.zero_grad();
    gaugewatch::hooks::begin_pass();
    auto x = embed->forward(x_idx);
    for (int64_t l = 0; l < kLayers; ++l) {
      gaugewatch::hooks::LayerScope scope("blocks." + std::to_string(l) + ".attn");
      auto qkv = blocks[l].qkv->forward(blocks[l].norm->forward(x))
                     .view({kBatch, kSeq, 3, kHeads, kDim / kHeads})
                     .permute({2, 0, 3, 1, 4});
      auto y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, /*is_causal=*/true);
      x = x + blocks[l].proj->forward(y.transpose(1, 2).reshape({kBatch, kSeq, kDim}));
    }
    auto logits = head->forward(x).to(torch::kFloat);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), y_idx.reshape({-1}));
    loss.backward();
    optimizer.step();
    std::printf("{\"step\": %d, \"loss\": %.6f}\n", step, loss.item<double>());
    std::fflush(stdout);
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  gaugewatch::hooks::flush(5.0);
  std::printf("{\"done\": true, \"stats\": %s}\n", gaugewatch::hooks::stats_json().c_str());
  return 0;
}
