#pragma once
// Switch decisions and the audit log, in SQLite (WAL mode). Every method is
// thread-safe; each write is its own transaction, durable before it returns.

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "gaugewatch/v1/admin_service.pb.h"

struct sqlite3;

namespace gaugewatch::agent {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DecisionStore {
 public:
  // Opens or creates the database at `path`. Throws StoreError.
  explicit DecisionStore(const std::string& path);
  ~DecisionStore();
  DecisionStore(const DecisionStore&) = delete;
  DecisionStore& operator=(const DecisionStore&) = delete;

  // Stores `decision` and sets its decision_id.
  void add_decision(gaugewatch::v1::Decision& decision);
  // Stores `record` and sets its audit_id.
  void add_audit(gaugewatch::v1::AuditRecord& record);

  // Every decision, oldest first (for the in-memory book at start-up).
  std::vector<gaugewatch::v1::Decision> all_decisions() const;
  // Newest first; run_id empty = all, else decisions for that run or all runs.
  std::vector<gaugewatch::v1::Decision> decisions(const std::string& run_id,
                                                  std::uint32_t limit) const;
  std::vector<gaugewatch::v1::AuditRecord> audit(const std::string& run_id,
                                                 std::uint32_t limit) const;
  std::uint64_t max_command_id() const;
  std::string journal_mode() const;

 private:
  void exec(const char* sql);
  std::vector<gaugewatch::v1::Decision> query_decisions(const std::string& sql,
                                                        const std::string& run_id,
                                                        std::int64_t limit) const;
  mutable std::mutex mu_;
  sqlite3* db_ = nullptr;
};

}  // namespace gaugewatch::agent
