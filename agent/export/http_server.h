#pragma once
// The agent's one HTTP port (civetweb): /metrics, /healthz and any page
// another part registers (register_handler). GET and HEAD (headers only);
// other methods get 405. Enough worker threads and a bounded request time
// that slow or idle clients cannot starve /healthz and /metrics.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

struct mg_context;
struct mg_connection;

namespace gaugewatch::agent {

class HttpServer {
 public:
  struct Request {
    std::string path;
    std::string query;   // after '?', undecoded ("" if none)
    std::string accept;  // the Accept header ("" if none)
  };
  struct Response {
    int status = 200;
    std::string content_type;
    std::string body;
  };
  using Handler = std::function<Response(const Request&)>;

  struct Options {
    int worker_threads = 64;          // requests served at once
    int request_timeout_ms = 5000;    // a whole request (headers included) must arrive within this
  };

  // Listens on host:port (port 0: a free port). Throws std::runtime_error.
  HttpServer(const std::string& listen, Options options);
  explicit HttpServer(const std::string& listen) : HttpServer(listen, Options{}) {}
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves `path` (exactly, e.g. "/status") with `handler` from now on; a
  // handler that throws answers 500 with the message. Replaces an earlier
  // handler of the same path.
  void register_handler(const std::string& path, Handler handler);

  std::uint16_t port() const { return port_; }

 private:
  static int handle(::mg_connection* conn, void* self);
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Handler>> handlers_;
  mg_context* ctx_ = nullptr;
  std::uint16_t port_ = 0;
};

// A minimal HTTP/1.1 request (civetweb client): returns the status, the
// Content-Length header (-1 if absent) and the body. Throws
// std::runtime_error on connection failure.
struct HttpResult {
  int status = 0;
  long long content_length = -1;
  std::string body;
};
HttpResult http_get(const std::string& host, std::uint16_t port, const std::string& path,
                    const std::string& accept = "", int timeout_ms = 10000,
                    const std::string& method = "GET");

}  // namespace gaugewatch::agent
