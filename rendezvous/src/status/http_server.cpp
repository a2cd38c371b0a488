// The bounded HTTP server (http_server.hpp). STUB: owned by a helper.
#include "ddp/status/http_server.hpp"

namespace ddp::status {

struct HttpServer::Impl {
  HttpOptions o;
  HttpHandler h;
};
HttpServer::HttpServer(HttpOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>(Impl{std::move(options), std::move(handler)})) {}
HttpServer::~HttpServer() = default;
void HttpServer::start() {}
void HttpServer::stop() {}
std::uint16_t HttpServer::port() const { return 0; }

}  // namespace ddp::status
