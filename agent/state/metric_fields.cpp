#include "agent/state/metric_fields.h"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>

namespace gaugewatch::agent {

namespace {

using gaugewatch::v1::LayerMetrics;

// The generated accessors of every LayerMetrics field, in MetricId order: the
// hot path (every ingested sample) reads through these instead of protobuf
// reflection, which costs a schema lookup per call. metric_fields() checks
// each row against the catalogue's field (set by name through reflection,
// read back here), so a row in the wrong place or a missing row throws.
struct FieldAccess {
  bool (LayerMetrics::*has)() const;
  double (LayerMetrics::*get)() const;
};

#define GAUGEWATCH_FIELD(field) FieldAccess{&LayerMetrics::has_##field, &LayerMetrics::field}
constexpr std::array<FieldAccess, reference::kMetricCount> kFieldAccess = {{
    GAUGEWATCH_FIELD(row_mass_abs_max),
    GAUGEWATCH_FIELD(row_mass_abs_mean),
    GAUGEWATCH_FIELD(row_mass_normalized_max),
    GAUGEWATCH_FIELD(row_mass_normalized_mean),
    GAUGEWATCH_FIELD(key_offset_median),
    GAUGEWATCH_FIELD(key_offset_max),
    GAUGEWATCH_FIELD(key_spread_median),
    GAUGEWATCH_FIELD(key_offset_spread_ratio_median),
    GAUGEWATCH_FIELD(key_offset_spread_ratio_max),
    GAUGEWATCH_FIELD(key_rms),
    GAUGEWATCH_FIELD(sharp_row_fraction),
    GAUGEWATCH_FIELD(logit_abs_max),
    GAUGEWATCH_FIELD(live_dq_discrepancy),
    GAUGEWATCH_FIELD(live_dk_discrepancy),
    GAUGEWATCH_FIELD(live_dv_discrepancy),
    GAUGEWATCH_FIELD(gproj_dq_discrepancy),
    GAUGEWATCH_FIELD(gproj_dk_discrepancy),
    GAUGEWATCH_FIELD(gproj_dv_discrepancy),
    GAUGEWATCH_FIELD(live_gauge_violation),
    GAUGEWATCH_FIELD(gproj_gauge_violation),
}};
#undef GAUGEWATCH_FIELD

// Throws std::logic_error unless accessor row i reads exactly the field the
// catalogue names for metric i.
void check_accessors(const MetricFieldTable& fields) {
  for (std::size_t i = 0; i < fields.size(); ++i) {
    LayerMetrics probe;
    const double marker = static_cast<double>(i + 1);
    probe.GetReflection()->SetDouble(&probe, fields[i], marker);
    for (std::size_t j = 0; j < kFieldAccess.size(); ++j) {
      const bool has = (probe.*kFieldAccess[j].has)();
      if (has != (i == j) || (has && (probe.*kFieldAccess[j].get)() != marker)) {
        throw std::logic_error("metric_fields.cpp: accessor row " + std::to_string(j) +
                               " does not read catalogue metric " + fields[j]->name() +
                               "; keep kFieldAccess in MetricId order");
      }
    }
  }
}

}  // namespace

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
    check_accessors(out);
    return out;
  }();
  return table;
}

namespace {

// Field I through its accessors; the constant member pointers inline.
template <std::size_t I>
void read_field(const LayerMetrics& metrics, MetricValues& out) {
  if ((metrics.*kFieldAccess[I].has)()) {
    out.present.set(I);
    out.value[I] = (metrics.*kFieldAccess[I].get)();
  }
}

template <std::size_t... I>
void read_fields(const LayerMetrics& metrics, MetricValues& out, std::index_sequence<I...>) {
  (read_field<I>(metrics, out), ...);
}

}  // namespace

MetricValues to_values(const gaugewatch::v1::LayerMetrics& metrics) {
  static const bool checked = (metric_fields(), true);
  (void)checked;
  MetricValues out;
  read_fields(metrics, out, std::make_index_sequence<reference::kMetricCount>());
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
