// The HTTP server's answers to requests civetweb cannot parse: a fixed status
// line, nothing of the request echoed (agent_logic_fuzz found civetweb's own
// 400 answer carrying the request's bytes, CR and LF included).

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "agent/export/http_server.h"

namespace gaugewatch::agent {
namespace {

// Sends `request` as it is, half-closes, returns everything the server sent.
std::string exchange(std::uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return answer;
}

TEST(HttpServer, MalformedRequestLinesGetAFixedStatusLineWithNothingEchoed) {
  HttpServer server("127.0.0.1:0");
  server.register_handler("/metrics", [](const HttpServer::Request&) {
    return HttpServer::Response{200, "text/plain", "up 1\n"};
  });
  for (const std::string request : {"HEAD /metrics Evil-Token HTTP/1.1\r\nHost: a\r\n\r\n",
                                    "GET / HTTP1/.0\r\n\r\n", "GET /metrics Injected: yes\r\n\r\n"}) {
    const std::string answer = exchange(server.port(), request);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << answer;
    EXPECT_EQ(answer.find("Evil"), std::string::npos) << answer;
    EXPECT_EQ(answer.find("HTTP1/"), std::string::npos) << answer;
    EXPECT_EQ(answer.find("Injected"), std::string::npos) << answer;
  }
  // Well-formed requests are served as before.
  EXPECT_EQ(exchange(server.port(), "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
}

}  // namespace
}  // namespace gaugewatch::agent
