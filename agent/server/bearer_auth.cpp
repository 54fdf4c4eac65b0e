#include "agent/server/bearer_auth.h"

#include "agent/server/unix_listener.h"

namespace gaugewatch::agent {

namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace

grpc::Status authorize_peer(const grpc::ServerContext& context, const std::string& token,
                            std::string_view what) {
  // Connections through the agent's unix socket: its permissions guard them.
  if (UnixListener::is_unix_peer(context.peer())) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return {grpc::StatusCode::UNAUTHENTICATED,
            std::string(what) + " over TCP need 'authorization: Bearer <token>'"};
  }
  const std::string_view value(it->second.data(), it->second.size());
  if (token.empty() || !constant_time_equal(value, "Bearer " + token)) {
    return {grpc::StatusCode::UNAUTHENTICATED, "bearer token does not match"};
  }
  return grpc::Status::OK;
}

}  // namespace gaugewatch::agent
