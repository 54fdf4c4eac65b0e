#include "agent/server/peer_identity.h"

#include "agent/server/unix_listener.h"

namespace gaugewatch::agent {

std::string peer_identity(const grpc::ServerContext& context) {
  const std::string peer = context.peer();
  if (auto credentials = UnixListener::credentials_of(peer)) {
    return "unix uid=" + std::to_string(credentials->uid) + " pid=" + std::to_string(credentials->pid);
  }
  return peer;
}

}  // namespace gaugewatch::agent
