#include "agent/server/session.h"

namespace gaugewatch::agent {

bool Session::push(gaugewatch::v1::AgentMessage message) {
  {
    std::lock_guard lock(mu_);
    if (closed_ || outbox_.size() >= kMaxOutbox) return false;
    outbox_.push_back(std::move(message));
  }
  cv_.notify_one();
  return true;
}

bool Session::pop(gaugewatch::v1::AgentMessage& out) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !outbox_.empty(); });
  if (outbox_.empty()) return false;
  out = std::move(outbox_.front());
  outbox_.pop_front();
  return true;
}

std::size_t Session::close() {
  std::size_t left = 0;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    left = outbox_.size();
    outbox_.clear();
  }
  cv_.notify_all();
  return left;
}

}  // namespace gaugewatch::agent
