#include "agent/server/unix_listener.h"

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "agent/common/event_log.h"

namespace gaugewatch::agent {

namespace {

std::mutex credentials_mu;
std::map<int, UnixListener::Credentials> credentials_by_fd;

sockaddr_un address_of(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    throw std::runtime_error("grpc_socket path longer than " +
                             std::to_string(sizeof address.sun_path - 1) + " bytes");
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

std::string errno_text() { return std::strerror(errno); }

// A socket is at `path`: refuse when something answers there (another agent),
// remove it when nothing does (left by an agent that died).
void clear_stale_socket(const std::string& path, const sockaddr_un& address) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISSOCK(st.st_mode)) {
    throw std::runtime_error("grpc_socket '" + path + "' exists and is not a socket; remove it or choose another path");
  }
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) throw std::runtime_error("socket: " + errno_text());
  const int connected =
      ::connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int connect_errno = errno;
  std::string owner;
  if (connected == 0) {
    ucred credentials{};
    socklen_t size = sizeof credentials;
    if (::getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &credentials, &size) == 0) {
      owner = " (pid " + std::to_string(credentials.pid) + ", uid " + std::to_string(credentials.uid) + ")";
    }
  }
  ::close(probe);
  if (connected == 0) {
    throw std::runtime_error("another process" + owner + " is listening on grpc_socket '" + path +
                             "': is a gaugewatch-agent already running? Stop it or choose another --grpc-socket");
  }
  if (connect_errno != ECONNREFUSED) {
    throw std::runtime_error("cannot probe grpc_socket '" + path + "': " + std::strerror(connect_errno));
  }
  if (::unlink(path.c_str()) != 0) {
    throw std::runtime_error("cannot remove the stale socket '" + path + "': " + errno_text());
  }
  events().info("removed a stale socket at {} (nothing answered on it)", path);
}

}  // namespace

UnixListener::UnixListener(const std::string& path, mode_t mode) : path_(path) {
  const sockaddr_un address = address_of(path);
  clear_stale_socket(path, address);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw std::runtime_error("socket: " + errno_text());
  // The socket is created with the final mode: no window where it is wider.
  const mode_t old_umask = ::umask(static_cast<mode_t>(~mode & 0777));
  const int bound = ::bind(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int bind_errno = errno;
  ::umask(old_umask);
  if (bound != 0) {
    ::close(fd_);
    throw std::runtime_error("cannot bind grpc_socket '" + path + "': " + std::strerror(bind_errno));
  }
  struct stat st;
  if (::chmod(path.c_str(), mode) != 0 || ::lstat(path.c_str(), &st) != 0 || ::listen(fd_, 128) != 0) {
    const std::string why = errno_text();
    ::unlink(path.c_str());
    ::close(fd_);
    throw std::runtime_error("cannot listen on grpc_socket '" + path + "': " + why);
  }
  device_ = st.st_dev;
  inode_ = st.st_ino;
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
}

UnixListener::~UnixListener() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void UnixListener::serve(grpc::Server& server) {
  thread_ = std::thread([this, &server] { accept_loop(server); });
}

void UnixListener::accept_loop(grpc::Server& server) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (!stopped_.load()) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      events().error("unix socket accept loop: poll: {}", errno_text());
      return;
    }
    if (fds[1].revents != 0) return;
    const int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        events().warn("unix socket accept: {}", errno_text());
      }
      continue;
    }
    ucred peer{};
    socklen_t size = sizeof peer;
    if (::getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0) {
      ::close(client);
      continue;
    }
    {
      std::lock_guard lock(credentials_mu);
      credentials_by_fd[client] = {peer.uid, peer.pid};
    }
    grpc::AddInsecureChannelFromFd(&server, client);
  }
}

void UnixListener::stop() {
  if (stopped_.exchange(true)) return;
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    if (::write(wake_fd_, &one, sizeof one) < 0) events().warn("unix listener wake: {}", errno_text());
    thread_.join();
  }
  ::close(fd_);
  // Remove the path only while it is still our socket: another agent may
  // have replaced it (never remove what this process did not create).
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == device_ && st.st_ino == inode_) {
    ::unlink(path_.c_str());
  }
}

std::optional<UnixListener::Credentials> UnixListener::credentials_of(const std::string& peer) {
  if (!is_unix_peer(peer)) return std::nullopt;
  int fd = -1;
  try {
    fd = std::stoi(peer.substr(3));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::lock_guard lock(credentials_mu);
  const auto it = credentials_by_fd.find(fd);
  if (it == credentials_by_fd.end()) return std::nullopt;
  return it->second;
}

}  // namespace gaugewatch::agent
