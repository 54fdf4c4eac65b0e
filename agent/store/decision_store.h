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

// Retention bounds (0 disables a bound). See AgentConfig.
struct RetentionPolicy {
  std::uint64_t audit_max_rows = 0;
  std::int64_t audit_max_age_ns = 0;
  std::uint64_t decision_history = 0;  // superseded decisions kept
};

struct PruneResult {
  std::uint64_t audit_deleted = 0;
  std::uint64_t decisions_deleted = 0;
  std::uint64_t audit_rows = 0;      // left after the pass
  std::uint64_t decision_rows = 0;
};

class DecisionStore {
 public:
  // Rows deleted per transaction by prune(): writers on the hot path wait at
  // most for one chunk.
  static constexpr std::int64_t kPruneChunkRows = 2000;

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
  // Largest command id ever stored (survives pruning of the audit log).
  std::uint64_t max_command_id() const;

  // Applies the retention policy. Decisions: the newest decision of each
  // target scope (run_id, all_runs, rank, layers) is always kept, since an
  // older one of the same scope can never be the newest that covers a layer;
  // of the superseded ones the newest `decision_history` stay. Audit log:
  // rows older than now - audit_max_age_ns go, then all but the newest
  // audit_max_rows. Throws StoreError.
  PruneResult prune(const RetentionPolicy& policy, std::int64_t now_unix_ns);
  std::uint64_t count_rows(const char* table) const;
  std::string journal_mode() const;

 private:
  void exec(const char* sql);
  void exec_on(sqlite3* db, const char* sql);
  // On the pruning connection (caller holds prune_mu_): runs `delete_sql`
  // (one int64 bound at ?1, the chunk size at ?2) until it deletes fewer than
  // a chunk, each chunk its own transaction. Returns rows deleted.
  std::uint64_t delete_in_chunks(const char* delete_sql, std::int64_t bound);
  // First column of the first row of `sql` (one int64 bound), or `fallback`.
  std::int64_t prune_query_int(const char* sql, std::int64_t bound, std::int64_t fallback);
  // Records the largest command id in the meta table (survives the audit rows).
  void keep_max_command_id(std::int64_t command_id);
  std::vector<gaugewatch::v1::Decision> query_decisions(const std::string& sql,
                                                        const std::string& run_id,
                                                        std::int64_t limit) const;
  mutable std::mutex mu_;
  sqlite3* db_ = nullptr;
  // Retention's own connection: its scans read a WAL snapshot and never hold
  // mu_, so the hot path's writes on db_ wait at most for one chunk's commit.
  std::mutex prune_mu_;
  sqlite3* prune_db_ = nullptr;
};

}  // namespace gaugewatch::agent
