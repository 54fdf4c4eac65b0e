#include "agent/export/http_server.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>

namespace gaugewatch::agent {

namespace {

void init_library_once() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

void send(struct mg_connection* conn, const HttpServer::Response& response) {
  const char* reason = response.status == 200 ? "OK" : "Service Unavailable";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            response.status, reason, response.content_type.c_str(), response.body.size());
  mg_write(conn, response.body.data(), response.body.size());
}

}  // namespace

HttpServer::HttpServer(const std::string& listen, MetricsHandler metrics, HealthHandler health)
    : metrics_(std::move(metrics)), health_(std::move(health)) {
  init_library_once();
  const char* options[] = {"listening_ports", listen.c_str(), "num_threads", "4",
                           "request_timeout_ms", "10000", nullptr};
  struct mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  struct mg_init_data init;
  std::memset(&init, 0, sizeof init);
  init.callbacks = &callbacks;
  init.user_data = this;
  init.configuration_options = options;
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
  mg_set_request_handler(ctx_, "/metrics$", &HttpServer::handle, this);
  mg_set_request_handler(ctx_, "/healthz$", &HttpServer::handle, this);
  struct mg_server_port ports[4];
  std::memset(ports, 0, sizeof ports);
  const int n = mg_get_server_ports(ctx_, 4, ports);
  if (n > 0) port_ = static_cast<std::uint16_t>(ports[0].port);
}

HttpServer::~HttpServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

int HttpServer::handle(struct mg_connection* conn, void* self_ptr) {
  auto* self = static_cast<HttpServer*>(self_ptr);
  const struct mg_request_info* info = mg_get_request_info(conn);
  if (std::strcmp(info->request_method, "GET") != 0 && std::strcmp(info->request_method, "HEAD") != 0) {
    mg_printf(conn, "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n");
    return 405;
  }
  try {
    if (std::strcmp(info->local_uri, "/metrics") == 0) {
      const char* accept = mg_get_header(conn, "Accept");
      send(conn, self->metrics_(accept ? accept : ""));
    } else {
      send(conn, self->health_());
    }
    return 200;
  } catch (const std::exception& e) {
    send(conn, {500, "text/plain", std::string("error: ") + e.what() + "\n"});
    return 500;
  }
}

HttpResult http_get(const std::string& host, std::uint16_t port, const std::string& path,
                    const std::string& accept, int timeout_ms) {
  init_library_once();
  char error[256] = {0};
  struct mg_connection* conn =
      mg_connect_client(host.c_str(), port, 0, error, sizeof error);
  if (conn == nullptr) {
    throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port) + ": " +
                             error);
  }
  std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + host + ":" +
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
  result.status = mg_get_response_info(conn)->status_code;
  char buffer[16384];
  while (true) {
    const int n = mg_read(conn, buffer, sizeof buffer);
    if (n <= 0) break;
    result.body.append(buffer, static_cast<std::size_t>(n));
  }
  mg_close_connection(conn);
  return result;
}

}  // namespace gaugewatch::agent
