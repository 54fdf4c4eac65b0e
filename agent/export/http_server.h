#pragma once
// HTTP endpoint of the agent (civetweb): GET /metrics (Prometheus text or
// OpenMetrics by Accept header) and GET /healthz.

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

struct mg_context;
struct mg_connection;

namespace gaugewatch::agent {

class HttpServer {
 public:
  struct Response {
    int status = 200;
    std::string content_type;
    std::string body;
  };
  // Called with the request's Accept header.
  using MetricsHandler = std::function<Response(const std::string& accept)>;
  using HealthHandler = std::function<Response()>;

  // Listens on host:port (port 0: a free port). Throws std::runtime_error.
  HttpServer(const std::string& listen, MetricsHandler metrics, HealthHandler health);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::uint16_t port() const { return port_; }

 private:
  static int handle(::mg_connection* conn, void* self);
  MetricsHandler metrics_;
  HealthHandler health_;
  mg_context* ctx_ = nullptr;
  std::uint16_t port_ = 0;
};

// A minimal HTTP/1.1 GET (civetweb client): returns the status and body.
// Throws std::runtime_error on connection failure.
struct HttpResult {
  int status = 0;
  std::string body;
};
HttpResult http_get(const std::string& host, std::uint16_t port, const std::string& path,
                    const std::string& accept = "", int timeout_ms = 10000);

}  // namespace gaugewatch::agent
