#include "agent/state/metric_fields.h"

#include <stdexcept>
#include <string>

namespace gaugewatch::agent {

const MetricFieldTable& metric_fields() {
  static const MetricFieldTable table = [] {
    MetricFieldTable out{};
    const auto* descriptor = gaugewatch::v1::LayerMetrics::descriptor();
    const auto& catalogue = reference::metric_catalogue();
    for (std::size_t i = 0; i < catalogue.size(); ++i) {
      const auto* field = descriptor->FindFieldByName(std::string(catalogue[i].name));
      if (field == nullptr ||
          field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
        throw std::logic_error("LayerMetrics lacks a double field for catalogue metric " +
                               std::string(catalogue[i].name));
      }
      out[i] = field;
    }
    if (static_cast<std::size_t>(descriptor->field_count()) != catalogue.size()) {
      throw std::logic_error("LayerMetrics has fields that are not in the metric catalogue");
    }
    return out;
  }();
  return table;
}

MetricValues to_values(const gaugewatch::v1::LayerMetrics& metrics) {
  MetricValues out;
  const auto& fields = metric_fields();
  const auto* reflection = metrics.GetReflection();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (reflection->HasField(metrics, fields[i])) {
      out.present.set(i);
      out.value[i] = reflection->GetDouble(metrics, fields[i]);
    }
  }
  return out;
}

void to_proto(const MetricValues& values, gaugewatch::v1::LayerMetrics& out) {
  const auto& fields = metric_fields();
  const auto* reflection = out.GetReflection();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (values.present.test(i)) reflection->SetDouble(&out, fields[i], values.value[i]);
  }
}

}  // namespace gaugewatch::agent
