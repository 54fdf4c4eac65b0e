#include "agent/export/exposition.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <iterator>
#include <sstream>

namespace gaugewatch::agent {

std::string render_metrics(const std::vector<const prometheus::Collectable*>& sources) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto* source : sources) {
    auto collected = source->Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return std::move(out).str();
}

}  // namespace gaugewatch::agent
