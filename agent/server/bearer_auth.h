#pragma once
// Bearer-token check shared by the admin service and the hook stream. Calls
// over the unix socket are trusted (its file permissions guard it); calls over
// TCP (TLS) must carry "authorization: Bearer <token>" (constant-time compare).

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace gaugewatch::agent {

// OK for unix-socket peers and for TCP peers presenting `token`; otherwise
// UNAUTHENTICATED naming `what` ("admin calls", "hook streams").
grpc::Status authorize_peer(const grpc::ServerContext& context, const std::string& token,
                            std::string_view what);

}  // namespace gaugewatch::agent
