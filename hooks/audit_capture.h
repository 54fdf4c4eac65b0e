#pragma once
// Captures: a whole call's operands written by the auditor thread with
// audit::save_operands into GAUGEWATCH_CAPTURE_DIR, while the files written
// stay under GAUGEWATCH_CAPTURE_MAX_BYTES.

#include "hooks/audit_job.h"

namespace gaugewatch::hooks {

void write_capture(const Job& job);

}  // namespace gaugewatch::hooks
