#include "agent/export/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace gaugewatch::agent {

namespace {

void init_library_once() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

void send(struct mg_connection* conn, const HttpServer::Response& response, bool with_body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            response.status, reason_phrase(response.status), response.content_type.c_str(),
            response.body.size());
  if (with_body) mg_write(conn, response.body.data(), response.body.size());
}

// civetweb's own error answers (to a request line it cannot parse, say)
// echo the request's version text into their status line, CR and LF
// included: "GET / x\r\nEvil: 1" was answered "HTTP/x\r\nEvil: 1 400 Bad
// Request" (found by agent_logic_fuzz). Every error goes out through send()
// instead, with a fixed status line and no text from the request.
int on_http_error(struct mg_connection* conn, int status, const char* /*message*/) {
  const struct mg_request_info* info = mg_get_request_info(conn);
  const bool head = info != nullptr && info->request_method != nullptr && std::strcmp(info->request_method, "HEAD") == 0;
  send(conn,
       {status, "text/plain; charset=utf-8", "Error " + std::to_string(status) + ": " + reason_phrase(status) + "\n"},
       !head);
  return 0;  // handled: civetweb sends nothing of its own
}

// Opens and closes a connection to the server's port on the loopback.
void wake(std::uint16_t port) {
  if (port == 0) return;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  ::close(fd);
}

}  // namespace

HttpServer::HttpServer(const std::string& listen, Options options) {
  init_library_once();
  const std::string threads = std::to_string(options.worker_threads);
  const std::string timeout = std::to_string(options.request_timeout_ms);
  // keep-alive off: a connection is one request, so an idle client holds a
  // worker for at most request_timeout_ms. Linger off (-1): close returns at
  // once and the kernel delivers what is still buffered; a linger of 0 would
  // reset the connection and cut a large /metrics body short.
  const char* config[] = {"listening_ports",    listen.c_str(),  "num_threads", threads.c_str(),
                          "request_timeout_ms", timeout.c_str(), "enable_keep_alive", "no",
                          "linger_timeout_ms",  "-1",            nullptr};
  struct mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  callbacks.http_error = &on_http_error;
  struct mg_init_data init;
  std::memset(&init, 0, sizeof init);
  init.callbacks = &callbacks;
  init.user_data = this;
  init.configuration_options = config;
  struct mg_error_data error;
  char error_text[256] = {0};
  unsigned error_code = 0;
  std::memset(&error, 0, sizeof error);
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof error_text;
  ctx_ = mg_start2(&init, &error);
  if (ctx_ == nullptr) {
    throw std::runtime_error("cannot listen for HTTP on '" + listen + "': " + error_text);
  }
  // Every path comes here; the handler table decides (404 for the rest).
  mg_set_request_handler(ctx_, "/", &HttpServer::handle, this);
  struct mg_server_port ports[4];
  std::memset(ports, 0, sizeof ports);
  const int n = mg_get_server_ports(ctx_, 4, ports);
  if (n > 0) port_ = static_cast<std::uint16_t>(ports[0].port);
}

HttpServer::~HttpServer() {
  if (ctx_ == nullptr) return;
  // civetweb's master thread polls its listening socket in 2 s quanta and
  // sees the stop flag only between polls; a connection wakes it, so a stop
  // takes milliseconds instead of up to 2 s.
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    mg_stop(ctx_);
    stopped = true;
  });
  for (int attempt = 0; attempt < 400 && !stopped.load(); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (stopped.load()) break;
    wake(port_);
  }
  stopper.join();
}

void HttpServer::register_handler(const std::string& path, Handler handler) {
  std::lock_guard lock(mu_);
  handlers_[path] = std::make_shared<const Handler>(std::move(handler));
}

int HttpServer::handle(struct mg_connection* conn, void* self_ptr) {
  auto* self = static_cast<HttpServer*>(self_ptr);
  const struct mg_request_info* info = mg_get_request_info(conn);
  const bool head = std::strcmp(info->request_method, "HEAD") == 0;
  if (!head && std::strcmp(info->request_method, "GET") != 0) {
    mg_printf(conn, "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n");
    return 405;
  }
  Request request;
  request.path = info->local_uri != nullptr ? info->local_uri : "/";
  request.query = info->query_string != nullptr ? info->query_string : "";
  const char* accept = mg_get_header(conn, "Accept");
  request.accept = accept != nullptr ? accept : "";
  std::shared_ptr<const Handler> handler;
  {
    std::lock_guard lock(self->mu_);
    const auto it = self->handlers_.find(request.path);
    if (it != self->handlers_.end()) handler = it->second;
  }
  if (!handler) {
    send(conn, {404, "text/plain; charset=utf-8", "not found: " + request.path + "\n"}, !head);
    return 404;
  }
  try {
    const Response response = (*handler)(request);
    send(conn, response, !head);
    return response.status;
  } catch (const std::exception& e) {
    send(conn, {500, "text/plain; charset=utf-8", std::string("error: ") + e.what() + "\n"}, !head);
    return 500;
  }
}

HttpResult http_get(const std::string& host, std::uint16_t port, const std::string& path,
                    const std::string& accept, int timeout_ms, const std::string& method) {
  init_library_once();
  char error[256] = {0};
  struct mg_connection* conn =
      mg_connect_client(host.c_str(), port, 0, error, sizeof error);
  if (conn == nullptr) {
    throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port) + ": " +
                             error);
  }
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: " + host + ":" +
                        std::to_string(port) + "\r\nConnection: close\r\n";
  if (!accept.empty()) request += "Accept: " + accept + "\r\n";
  request += "\r\n";
  mg_write(conn, request.data(), request.size());
  if (mg_get_response(conn, error, sizeof error, timeout_ms) < 0) {
    mg_close_connection(conn);
    throw std::runtime_error("no HTTP response from " + host + ":" + std::to_string(port) +
                             ": " + error);
  }
  HttpResult result;
  const struct mg_response_info* info = mg_get_response_info(conn);
  result.status = info->status_code;
  result.content_length = info->content_length;
  if (method != "HEAD") {
    char buffer[16384];
    while (true) {
      const int n = mg_read(conn, buffer, sizeof buffer);
      if (n <= 0) break;
      result.body.append(buffer, static_cast<std::size_t>(n));
    }
  }
  mg_close_connection(conn);
  return result;
}

}  // namespace gaugewatch::agent
