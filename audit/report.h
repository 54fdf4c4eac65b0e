#pragma once
// Human and machine renderings of an audit report.

#include <nlohmann/json.hpp>
#include <string>

#include "audit/audit_run.h"

namespace gaugewatch::audit {

// A table per backend (errors vs FP64, the offset coordinate) and the metrics.
std::string format_report(const AuditReport& report);
nlohmann::json report_to_json(const AuditReport& report);

}  // namespace gaugewatch::audit
