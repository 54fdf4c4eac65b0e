#pragma once
// Who is on the other end of a gRPC call, for the audit and event logs:
// unix-socket callers as "unix uid=U pid=P" (SO_PEERCRED, taken when the
// agent accepted the connection), others as gRPC spells the peer.

#include <grpcpp/grpcpp.h>

#include <string>

namespace gaugewatch::agent {

std::string peer_identity(const grpc::ServerContext& context);

}  // namespace gaugewatch::agent
