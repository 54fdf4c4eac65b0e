#pragma once
// The per-sample attention metrics of docs/numerics.md, as data: one row per
// metric with its wire name, unit and meaning. The reference, the audit
// report, the proto and (later) the agent's exporter all name metrics from
// this table; nothing else spells a metric name.

#include <array>
#include <cstddef>
#include <string_view>

namespace gaugewatch::reference {

enum class MetricId : std::size_t {
  kRowMassAbsMax,
  kRowMassAbsMean,
  kRowMassNormalizedMax,
  kRowMassNormalizedMean,
  kKeyOffsetMedian,
  kKeyOffsetMax,
  kKeySpreadMedian,
  kKeyOffsetSpreadRatioMedian,
  kKeyOffsetSpreadRatioMax,
  kKeyRms,
  kSharpRowFraction,
  kLogitAbsMax,
  kLiveDqDiscrepancy,
  kLiveDkDiscrepancy,
  kLiveDvDiscrepancy,
  kGprojDqDiscrepancy,
  kGprojDkDiscrepancy,
  kGprojDvDiscrepancy,
  kLiveGaugeViolation,
  kGprojGaugeViolation,
  kCount,
};

struct MetricSpec {
  MetricId id;
  std::string_view name;  // snake_case, stable: used on the wire and in Prometheus
  std::string_view unit;  // "ratio" (dimensionless) or the quantity's unit
  std::string_view help;
};

inline constexpr std::size_t kMetricCount = static_cast<std::size_t>(MetricId::kCount);

const std::array<MetricSpec, kMetricCount>& metric_catalogue();
const MetricSpec& metric_spec(MetricId id);

}  // namespace gaugewatch::reference
