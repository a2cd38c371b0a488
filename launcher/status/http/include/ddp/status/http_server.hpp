// A small bounded HTTP/1.1 server (Boost.Beast) for the status views: GET and HEAD only, on
// one thread of its own; connections, request size and time per request are capped.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::status {

struct HttpRequest {
  std::string method;  // GET or HEAD (others are answered 405 before the handler)
  std::string path;    // without the query
  std::string query;   // after '?', undecoded ("" when none)
};

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int s, std::string type, std::string text)
      : status(s), content_type(std::move(type)), body(std::move(text)) {}
  int status = 200;  // 100..599; anything else is sent as 500
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;  // a HEAD request gets its Content-Length and no body
  std::vector<std::pair<std::string, std::string>> headers;  // more fields (no CR or LF)
};

// Called on the server's thread only, one request at a time: it may block (a store read), but
// every other connection waits meanwhile, so keep its own timeouts short. An exception it
// throws is answered 500 with no detail (the message goes to the "status" log).
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;  // 0: the OS picks one; read it back with port()
  // Connections served at once; one more is accepted, answered 503 and closed.
  std::size_t max_connections = 64;
  // Request line and headers; over it: 431 and the connection closes. Bodies are refused (413).
  std::size_t max_request_bytes = 16 * 1024;
  // From the connection's start or its last reply to a complete request head; past it the
  // connection closes (slowloris, idle keep-alive connections).
  std::chrono::milliseconds request_timeout{5000};
  // To send one reply to a client that reads slowly; past it the connection closes.
  std::chrono::milliseconds write_timeout{30000};
  // Non-empty: every route but /healthz asks for it (http_auth.hpp); a request without it is
  // answered 401 before the handler. Empty: open, as before.
  std::string token;
  // Both set: HTTPS only, with this certificate chain and its key (PEM files); ConfigError at
  // start() naming a file that cannot be used.
  std::string tls_cert, tls_key;
};

// Counters since start(), readable from any thread.
struct HttpStats {
  std::uint64_t connections_open = 0;
  std::uint64_t connections_total = 0;    // accepted and served
  std::uint64_t connections_refused = 0;  // over max_connections (503)
  std::uint64_t requests = 0;             // replies sent, errors included
  std::uint64_t timeouts = 0;             // closed: no complete request within request_timeout
  std::uint64_t rejected = 0;             // malformed, too large, with a body, or not GET/HEAD
  std::uint64_t handler_errors = 0;       // the handler threw (500)
  std::uint64_t unauthorized = 0;         // without the token (401)
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  // Binds and starts the thread; throws ddp::IoError "cannot listen for HTTP on HOST:PORT: ..."
  // (once only: a second call is a ddp::ConfigError).
  void start();
  // Closes the listener and every connection and joins the thread; idempotent. A handler that
  // is running finishes first.
  void stop();
  std::uint16_t port() const;  // the bound port (0 before start())
  HttpStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::status
