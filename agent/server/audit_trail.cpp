#include "agent/server/audit_trail.h"

#include "agent/common/clock.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

void AuditTrail::record(v1::AuditKind kind, const std::string& run_id, const std::uint32_t* rank,
                        std::uint64_t command_id, std::uint64_t decision_id, std::string detail) {
  v1::AuditRecord record;
  record.set_unix_time_ns(unix_now_ns());
  record.set_kind(kind);
  record.set_run_id(run_id);
  if (rank != nullptr) record.set_rank(*rank);
  record.set_command_id(command_id);
  record.set_decision_id(decision_id);
  record.set_detail(std::move(detail));
  store_.add_audit(record);
}

void AuditTrail::record_or_count(v1::AuditKind kind, const std::string& run_id, const std::uint32_t* rank,
                                 std::uint64_t command_id, std::uint64_t decision_id, std::string detail) {
  try {
    record(kind, run_id, rank, command_id, decision_id, std::move(detail));
  } catch (const StoreError&) {
    counters_.store_errors_total.Increment();
  }
}

}  // namespace gaugewatch::agent
