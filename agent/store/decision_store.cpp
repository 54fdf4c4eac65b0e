#include "agent/store/decision_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <sstream>

namespace gaugewatch::agent {

namespace {

class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK) {
      throw StoreError(std::string("sqlite prepare: ") + sqlite3_errmsg(db));
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  void bind(int index, std::int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  void bind(int index, const std::string& value) {
    sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  }
  void bind_null(int index) { sqlite3_bind_null(stmt_, index); }
  void reset() { sqlite3_reset(stmt_); }
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw StoreError(std::string("sqlite step: ") + sqlite3_errmsg(db_));
  }
  std::int64_t integer(int column) { return sqlite3_column_int64(stmt_, column); }
  bool is_null(int column) { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
  std::string text(int column) {
    const auto* data = sqlite3_column_text(stmt_, column);
    return data ? std::string(reinterpret_cast<const char*>(data),
                              static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)))
                : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

std::string join_layers(const google::protobuf::RepeatedField<std::uint32_t>& layers) {
  std::ostringstream out;
  for (int i = 0; i < layers.size(); ++i) out << (i ? "," : "") << layers.Get(i);
  return out.str();
}

void split_layers(const std::string& text, gaugewatch::v1::Target& target) {
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) target.add_layers(static_cast<std::uint32_t>(std::stoul(item)));
  }
}

constexpr const char* kDecisionColumns =
    "SELECT id, time_ns, source, rule, run_id, all_runs, rank, layers, backend, reason "
    "FROM decisions ";

}  // namespace

DecisionStore::DecisionStore(const std::string& path) {
  // Decisions and the audit log are for the agent's user only: the file is
  // created 0600 (SQLite gives its -wal and -shm files the same mode), and
  // an existing one is narrowed to 0600.
  if (path != ":memory:") {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ::fchmod(fd, 0600) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      throw StoreError("cannot open database '" + path + "': " + why +
                       " (does its directory exist and belong to the agent's user?)");
    }
    ::close(fd);
    for (const char* suffix : {"-wal", "-shm"}) ::chmod((path + suffix).c_str(), 0600);
  }
  if (sqlite3_open_v2(path.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw StoreError("cannot open database '" + path + "': " + message);
  }
  sqlite3_busy_timeout(db_, 5000);
  try {
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=NORMAL");
    exec(
        "CREATE TABLE IF NOT EXISTS decisions ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, time_ns INTEGER NOT NULL,"
        " source INTEGER NOT NULL, rule TEXT NOT NULL, run_id TEXT NOT NULL,"
        " all_runs INTEGER NOT NULL, rank INTEGER, layers TEXT NOT NULL,"
        " backend INTEGER NOT NULL, reason TEXT NOT NULL)");
    exec(
        "CREATE TABLE IF NOT EXISTS audit ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, time_ns INTEGER NOT NULL,"
        " kind INTEGER NOT NULL, run_id TEXT NOT NULL, rank INTEGER,"
        " command_id INTEGER NOT NULL, decision_id INTEGER NOT NULL, detail TEXT NOT NULL)");
    exec("CREATE INDEX IF NOT EXISTS audit_run ON audit(run_id)");
    exec("CREATE INDEX IF NOT EXISTS audit_time ON audit(time_ns)");
    exec("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)");
    // A second connection for retention (see prune()).
    if (sqlite3_open_v2(path.c_str(), &prune_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX,
                        nullptr) != SQLITE_OK) {
      throw StoreError("cannot open database '" + path + "' for retention: " +
                       (prune_db_ ? sqlite3_errmsg(prune_db_) : "out of memory"));
    }
    sqlite3_busy_timeout(prune_db_, 5000);
    exec_on(prune_db_, "PRAGMA synchronous=NORMAL");
  } catch (...) {
    sqlite3_close(prune_db_);
    prune_db_ = nullptr;
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

DecisionStore::~DecisionStore() {
  sqlite3_close(prune_db_);
  sqlite3_close(db_);
}

void DecisionStore::exec(const char* sql) { exec_on(db_, sql); }

void DecisionStore::exec_on(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : "unknown error";
    sqlite3_free(error);
    throw StoreError(std::string("sqlite: ") + message + " in: " + sql);
  }
}

std::string DecisionStore::journal_mode() const {
  std::lock_guard lock(mu_);
  Statement stmt(db_, "PRAGMA journal_mode");
  return stmt.step() ? stmt.text(0) : std::string();
}

void DecisionStore::add_decision(gaugewatch::v1::Decision& decision) {
  std::lock_guard lock(mu_);
  Statement stmt(db_,
                 "INSERT INTO decisions (time_ns, source, rule, run_id, all_runs, rank, layers,"
                 " backend, reason) VALUES (?,?,?,?,?,?,?,?,?)");
  const auto& target = decision.target();
  stmt.bind(1, decision.unix_time_ns());
  stmt.bind(2, decision.source());
  stmt.bind(3, decision.rule());
  stmt.bind(4, target.run_id());
  stmt.bind(5, target.all_runs() ? 1 : 0);
  if (target.has_rank()) {
    stmt.bind(6, target.rank());
  } else {
    stmt.bind_null(6);
  }
  stmt.bind(7, join_layers(target.layers()));
  stmt.bind(8, decision.backend());
  stmt.bind(9, decision.reason());
  stmt.step();
  decision.set_decision_id(static_cast<std::uint64_t>(sqlite3_last_insert_rowid(db_)));
}

void DecisionStore::add_audit(gaugewatch::v1::AuditRecord& record) {
  std::lock_guard lock(mu_);
  Statement stmt(db_,
                 "INSERT INTO audit (time_ns, kind, run_id, rank, command_id, decision_id, detail)"
                 " VALUES (?,?,?,?,?,?,?)");
  stmt.bind(1, record.unix_time_ns());
  stmt.bind(2, record.kind());
  stmt.bind(3, record.run_id());
  if (record.has_rank()) {
    stmt.bind(4, record.rank());
  } else {
    stmt.bind_null(4);
  }
  stmt.bind(5, static_cast<std::int64_t>(record.command_id()));
  stmt.bind(6, static_cast<std::int64_t>(record.decision_id()));
  stmt.bind(7, record.detail());
  stmt.step();
  record.set_audit_id(static_cast<std::uint64_t>(sqlite3_last_insert_rowid(db_)));
}

std::vector<gaugewatch::v1::Decision> DecisionStore::query_decisions(const std::string& sql,
                                                                     const std::string& run_id,
                                                                     std::int64_t limit) const {
  std::lock_guard lock(mu_);
  Statement stmt(db_, sql);
  int index = 1;
  if (!run_id.empty()) stmt.bind(index++, run_id);
  if (limit > 0) stmt.bind(index++, limit);
  std::vector<gaugewatch::v1::Decision> out;
  while (stmt.step()) {
    gaugewatch::v1::Decision decision;
    decision.set_decision_id(static_cast<std::uint64_t>(stmt.integer(0)));
    decision.set_unix_time_ns(stmt.integer(1));
    decision.set_source(static_cast<gaugewatch::v1::DecisionSource>(stmt.integer(2)));
    decision.set_rule(stmt.text(3));
    auto* target = decision.mutable_target();
    target->set_run_id(stmt.text(4));
    target->set_all_runs(stmt.integer(5) != 0);
    if (!stmt.is_null(6)) target->set_rank(static_cast<std::uint32_t>(stmt.integer(6)));
    split_layers(stmt.text(7), *target);
    decision.set_backend(static_cast<gaugewatch::v1::Backend>(stmt.integer(8)));
    decision.set_reason(stmt.text(9));
    out.push_back(std::move(decision));
  }
  return out;
}

std::vector<gaugewatch::v1::Decision> DecisionStore::all_decisions() const {
  return query_decisions(std::string(kDecisionColumns) + "ORDER BY id ASC", "", 0);
}

std::vector<gaugewatch::v1::Decision> DecisionStore::decisions(const std::string& run_id,
                                                               std::uint32_t limit) const {
  std::string sql = kDecisionColumns;
  if (!run_id.empty()) sql += "WHERE run_id = ? OR all_runs = 1 ";
  sql += "ORDER BY id DESC LIMIT ?";
  return query_decisions(sql, run_id, limit == 0 ? 100 : limit);
}

std::vector<gaugewatch::v1::AuditRecord> DecisionStore::audit(const std::string& run_id,
                                                              std::uint32_t limit) const {
  std::lock_guard lock(mu_);
  std::string sql =
      "SELECT id, time_ns, kind, run_id, rank, command_id, decision_id, detail FROM audit ";
  if (!run_id.empty()) sql += "WHERE run_id = ? ";
  sql += "ORDER BY id DESC LIMIT ?";
  Statement stmt(db_, sql);
  int index = 1;
  if (!run_id.empty()) stmt.bind(index++, run_id);
  stmt.bind(index, static_cast<std::int64_t>(limit == 0 ? 100 : limit));
  std::vector<gaugewatch::v1::AuditRecord> out;
  while (stmt.step()) {
    gaugewatch::v1::AuditRecord record;
    record.set_audit_id(static_cast<std::uint64_t>(stmt.integer(0)));
    record.set_unix_time_ns(stmt.integer(1));
    record.set_kind(static_cast<gaugewatch::v1::AuditKind>(stmt.integer(2)));
    record.set_run_id(stmt.text(3));
    if (!stmt.is_null(4)) record.set_rank(static_cast<std::uint32_t>(stmt.integer(4)));
    record.set_command_id(static_cast<std::uint64_t>(stmt.integer(5)));
    record.set_decision_id(static_cast<std::uint64_t>(stmt.integer(6)));
    record.set_detail(stmt.text(7));
    out.push_back(std::move(record));
  }
  return out;
}

std::uint64_t DecisionStore::max_command_id() const {
  std::lock_guard lock(mu_);
  Statement stmt(db_,
                 "SELECT MAX(COALESCE((SELECT MAX(command_id) FROM audit), 0),"
                 " COALESCE((SELECT value FROM meta WHERE key = 'max_command_id'), 0))");
  return stmt.step() ? static_cast<std::uint64_t>(stmt.integer(0)) : 0;
}

std::uint64_t DecisionStore::count_rows(const char* table) const {
  std::lock_guard lock(mu_);
  Statement stmt(db_, std::string("SELECT COUNT(*) FROM ") + table);
  return stmt.step() ? static_cast<std::uint64_t>(stmt.integer(0)) : 0;
}

std::int64_t DecisionStore::prune_query_int(const char* sql, std::int64_t bound,
                                            std::int64_t fallback) {
  Statement stmt(prune_db_, sql);
  stmt.bind(1, bound);
  if (!stmt.step() || stmt.is_null(0)) return fallback;
  return stmt.integer(0);
}

void DecisionStore::keep_max_command_id(std::int64_t command_id) {
  if (command_id <= 0) return;
  Statement stmt(prune_db_,
                 "INSERT INTO meta (key, value) VALUES ('max_command_id', ?)"
                 " ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)");
  stmt.bind(1, command_id);
  stmt.step();
}

std::uint64_t DecisionStore::delete_in_chunks(const char* delete_sql, std::int64_t bound) {
  std::uint64_t deleted = 0;
  Statement stmt(prune_db_, delete_sql);
  for (;;) {
    stmt.bind(1, bound);
    stmt.bind(2, kPruneChunkRows);
    stmt.step();  // one statement, one short write transaction
    stmt.reset();
    const auto changed = static_cast<std::uint64_t>(sqlite3_changes(prune_db_));
    deleted += changed;
    if (changed < static_cast<std::uint64_t>(kPruneChunkRows)) return deleted;
  }
}

PruneResult DecisionStore::prune(const RetentionPolicy& policy, std::int64_t now_unix_ns) {
  // Everything here runs on the pruning connection: its reads (scans, counts)
  // see a WAL snapshot and never block the hot path's writes on the main
  // connection; its writes are single chunk-sized transactions.
  std::lock_guard prune_lock(prune_mu_);
  PruneResult result;
  if (policy.audit_max_age_ns > 0) {
    const std::int64_t cutoff_ns = now_unix_ns - policy.audit_max_age_ns;
    // Command ids continue from the largest stored one after a restart; keep
    // that number before the rows holding it go.
    keep_max_command_id(prune_query_int(
        "SELECT MAX(command_id) FROM audit WHERE time_ns < ?", cutoff_ns, 0));
    result.audit_deleted += delete_in_chunks(
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE time_ns < ?1"
        " ORDER BY time_ns LIMIT ?2)",
        cutoff_ns);
  }
  if (policy.audit_max_rows > 0) {
    const std::int64_t cutoff_id =
        prune_query_int("SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?",
                        static_cast<std::int64_t>(policy.audit_max_rows), -1);
    if (cutoff_id >= 0) {
      keep_max_command_id(
          prune_query_int("SELECT MAX(command_id) FROM audit WHERE id <= ?", cutoff_id, 0));
      result.audit_deleted += delete_in_chunks(
          "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE id <= ?1 ORDER BY id LIMIT ?2)",
          cutoff_id);
    }
  }
  // Superseded decisions beyond the history bound: rank > 1 within their
  // scope, newest first, after the first `decision_history` of them.
  std::vector<std::int64_t> doomed;
  {
    Statement stmt(prune_db_,
                   "SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY run_id, all_runs,"
                   " rank, layers ORDER BY id DESC) AS n FROM decisions) WHERE n > 1"
                   " ORDER BY id DESC LIMIT -1 OFFSET ?");
    stmt.bind(1, static_cast<std::int64_t>(policy.decision_history));
    while (stmt.step()) doomed.push_back(stmt.integer(0));
  }
  for (std::size_t begin = 0; begin < doomed.size();
       begin += static_cast<std::size_t>(kPruneChunkRows)) {
    const std::size_t end =
        std::min(doomed.size(), begin + static_cast<std::size_t>(kPruneChunkRows));
    exec_on(prune_db_, "BEGIN IMMEDIATE");
    try {
      Statement stmt(prune_db_, "DELETE FROM decisions WHERE id = ?");
      for (std::size_t i = begin; i < end; ++i) {
        stmt.bind(1, doomed[i]);
        stmt.step();
        stmt.reset();
        result.decisions_deleted += static_cast<std::uint64_t>(sqlite3_changes(prune_db_));
      }
      exec_on(prune_db_, "COMMIT");
    } catch (...) {
      sqlite3_exec(prune_db_, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }
  for (auto [table, rows] : {std::pair{"audit", &result.audit_rows},
                              std::pair{"decisions", &result.decision_rows}}) {
    Statement stmt(prune_db_, std::string("SELECT COUNT(*) FROM ") + table);
    *rows = stmt.step() ? static_cast<std::uint64_t>(stmt.integer(0)) : 0;
  }
  return result;
}

}  // namespace gaugewatch::agent
