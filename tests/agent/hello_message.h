#pragma once
// A trainer's Hello for the exposition tests: `layers` layers on stock (layer
// 1 on `layer1_backend`), layer 0 named `first_name` (a name that needs the
// text format's escapes), the others attn.<i>.

#include <cstdint>
#include <string>

#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

inline gaugewatch::v1::Hello hello_message(const std::string& run, std::uint32_t rank, int layers,
                                           const std::string& first_name = "attn \"q\\k\"",
                                           gaugewatch::v1::Backend layer1_backend = gaugewatch::v1::BACKEND_STOCK) {
  gaugewatch::v1::Hello h;
  h.set_protocol_version(gaugewatch::v1::PROTOCOL_VERSION_1);
  h.set_run_id(run);
  h.set_rank(rank);
  h.set_world_size(rank + 1);
  for (int i = 0; i < layers; ++i) {
    auto* layer = h.add_layers();
    layer->set_index(static_cast<std::uint32_t>(i));
    layer->set_name(i == 0 ? first_name : "attn." + std::to_string(i));
    layer->set_backend(i == 1 ? layer1_backend : gaugewatch::v1::BACKEND_STOCK);
  }
  return h;
}

}  // namespace gaugewatch::agent
