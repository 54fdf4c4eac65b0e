#pragma once
// The agent's unix socket, owned by the agent rather than by gRPC: it binds
// the path itself (refusing when a live agent answers there, removing only a
// stale socket), accepts connections, records each caller's SO_PEERCRED
// (uid, pid) and hands the connection to the gRPC server. On exit it removes
// the path only while it is still the socket this listener created.

#include <sys/types.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>

namespace grpc {
class Server;
}

namespace gaugewatch::agent {

class UnixListener {
 public:
  struct Credentials {
    uid_t uid = 0;
    pid_t pid = 0;
  };

  // Binds `path` with permissions `mode` (no window with wider ones) and
  // listens. Throws std::runtime_error saying what is wrong and what to do.
  UnixListener(const std::string& path, mode_t mode);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts handing accepted connections to `server` (already started).
  void serve(grpc::Server& server);
  // Stops accepting; removes the path if it is still this listener's socket.
  void stop();

  // The credentials of a caller that came through a UnixListener, by its
  // gRPC peer string; nullopt for any other peer.
  static std::optional<Credentials> credentials_of(const std::string& peer);
  // Whether a gRPC peer string names a connection accepted here.
  static bool is_unix_peer(const std::string& peer) { return peer.rfind("fd:", 0) == 0; }

 private:
  void accept_loop(grpc::Server& server);

  const std::string path_;
  int fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the accept loop to stop
  dev_t device_ = 0;
  ino_t inode_ = 0;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace gaugewatch::agent
