// CUDA implementation of gaugewatch::attention_metrics (issue 3, item 3).
// Schema and semantics: kernels/torch/registration.cpp.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>

#include "kernels/torch/registration.h"

namespace gaugewatch::torch_ops {
namespace {

at::Tensor attention_metrics_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, const at::Tensor&, bool, std::optional<double>, c10::string_view,
                                  const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "gaugewatch: attention_metrics on CUDA needs the metric reduction kernels, which are not "
                     "built yet (issue 3, item 3); pass CPU tensors for the reference metrics");
}

}  // namespace

void register_cuda_metrics(torch::Library& m) { m.impl("attention_metrics", &attention_metrics_cuda); }

}  // namespace gaugewatch::torch_ops
