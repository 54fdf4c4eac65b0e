#include "agent/export/exposition.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <iterator>

namespace gaugewatch::agent {

std::string render_metrics(const std::vector<const prometheus::Collectable*>& sources,
                           const StateCollector& state) {
  std::vector<prometheus::MetricFamily> families;
  const auto collect = [&](const prometheus::Collectable& source) {
    auto collected = source.Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  };
  for (const auto* source : sources) collect(*source);
  collect(state);
  std::string text = prometheus::TextSerializer().Serialize(families);
  state.append_layer_series(text);
  return text;
}

}  // namespace gaugewatch::agent
