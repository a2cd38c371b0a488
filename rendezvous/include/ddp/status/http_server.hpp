// A small bounded HTTP/1.1 server (Boost.Beast) for the status views: GET and HEAD only, on
// one thread of its own; connections, request size and time per request are capped.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ddp::status {

struct HttpRequest {
  std::string method;  // GET or HEAD (others are answered 405 before the handler)
  std::string path;    // without the query
  std::string query;   // after '?', undecoded ("" when none)
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;  // 0: the OS picks one; read it back with port()
  std::size_t max_connections = 64;
  std::size_t max_request_bytes = 16 * 1024;  // request line and headers
  std::chrono::milliseconds request_timeout{5000};
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  void start();  // binds and starts the thread; throws ddp::IoError naming the address
  void stop();   // idempotent
  std::uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::status
