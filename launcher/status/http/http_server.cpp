// The bounded HTTP server (http_server.hpp): one io_context on one thread, a Session per
// connection (plain TCP, or TLS over it with a certificate) that reads a request head under a
// deadline, answers it and reads the next.
// Descriptors are close-on-exec (accept4), so an agent that embeds it forks workers safely.
#include "ddp/status/http_server.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <utility>  // before Asio: 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/log.hpp"
#include "ddp/status/http_auth.hpp"

namespace ddp::status {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
constexpr auto kMaxLinger = std::chrono::milliseconds(2000);
constexpr std::size_t kMaxDrain = 64 * 1024;    // bytes read and dropped after a refusal
constexpr std::size_t kBufferSlack = 4 * 1024;  // the read buffer: one head + this

// Sent without waiting to a connection over max_connections, which then closes.
const std::string& busy_reply() {
  static const std::string body = "too many connections\n";
  static const std::string reply =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
      "Cache-Control: no-store\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  return reply;
}

// What stop() needs of every connection, whatever its stream.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void close_now() = 0;
};

// Everything the server's thread touches. Members used by a Session's destructor come before
// the io_context, which destroys the sessions still held by its pending handlers.
struct Core {
  HttpOptions o;
  HttpHandler handler;
  std::atomic<std::uint64_t> open{0}, total{0}, refused{0}, requests{0}, timeouts{0}, rejected{0},
      handler_errors{0}, unauthorized{0};
  std::unordered_set<SessionBase*> sessions;  // the server's thread only (or after it ended)
  std::optional<asio::ssl::context> tls;      // HttpOptions::tls_cert: HTTPS only
  asio::io_context io{1};
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> accept_retry;
  tcp protocol = tcp::v4();
  std::atomic<std::uint16_t> port{0};
  std::thread thread;
  std::mutex mu;  // start() and stop()
  bool started = false, stopped = false;

  Core(HttpOptions options, HttpHandler h) : o(std::move(options)), handler(std::move(h)) {}
  void accept();
  void adopt(int fd);
};

HttpResponse plain(int status, std::string body) {
  return {status, "text/plain; charset=utf-8", std::move(body)};
}

bool valid(const HttpResponse& r) {
  const auto clean = [](const std::string& s) {
    return s.find_first_of("\r\n") == std::string::npos;
  };
  for (const auto& [name, value] : r.headers) {
    if (name.empty() || !clean(name) || !clean(value)) return false;
  }
  return r.status >= 200 && r.status <= 599 && clean(r.content_type);
}

// Stream: beast::tcp_stream, or beast::ssl_stream over one (HTTPS).
template <class Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  Session(Core& core, Stream stream)
      : c_(core), stream_(std::move(stream)), buffer_(core.o.max_request_bytes + kBufferSlack) {
    c_.sessions.insert(this);
    c_.open.fetch_add(1);
    c_.total.fetch_add(1);
  }
  ~Session() {
    c_.sessions.erase(this);
    c_.open.fetch_sub(1);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

  // HTTPS: the TLS handshake first, under the request's deadline (a client that never finishes
  // it is a slow client like any other).
  void start() {
    if constexpr (kTls) {
      tcp().expires_after(c_.o.request_timeout);
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = shared_from_this()](beast::error_code ec) {
                                if (ec) {
                                  self->c_.rejected.fetch_add(1);
                                  return;
                                }
                                self->read_head();
                              });
    } else {
      read_head();
    }
  }
  void close_now() override { tcp().close(); }

 private:
  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }

  void read_head() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<std::size_t>(c_.o.max_request_bytes, std::uint32_t{0xffffffff})));
    head_ = false;
    version_ = 11;
    tcp().expires_after(c_.o.request_timeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_head(ec); });
  }

  void on_head(beast::error_code ec) {
    if (ec) {
      if (ec == beast::error::timeout) {
        c_.timeouts.fetch_add(1);
      } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
        c_.rejected.fetch_add(1);
        reply(plain(431, "request header fields too large\n"), true);
      } else if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
                 ec != http::error::end_of_stream && ec != http::error::partial_message) {
        c_.rejected.fetch_add(1);
        reply(plain(400, "bad request\n"), true);
      }
      return;  // else: the peer closed, or the socket failed; the session ends here
    }
    const auto& req = parser_->get();
    const auto length = parser_->content_length();
    const bool has_body = parser_->chunked() || (length && *length > 0);
    const bool keep = req.keep_alive();
    version_ = req.version() == 10 ? 10 : 11;
    head_ = req.method() == http::verb::head;
    if (req.method() != http::verb::get && !head_) {
      c_.rejected.fetch_add(1);
      // The body is never read: after it the connection cannot carry another request.
      reply(plain(405, "method not allowed\n"), has_body || !keep, true);
      return;
    }
    if (has_body) {
      c_.rejected.fetch_add(1);
      reply(plain(413, "request bodies are not accepted\n"), true);
      return;
    }
    const std::string_view target(req.target().data(), req.target().size());
    if (target.empty() || target[0] != '/') {
      c_.rejected.fetch_add(1);
      reply(plain(400, "bad request target\n"), !keep);
      return;
    }
    HttpRequest request;
    request.method = head_ ? "HEAD" : "GET";
    const auto q = target.find('?');
    request.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
    if (!c_.o.token.empty() && request.path != kPublicPath) {
      const auto header = [&](http::field f) {
        const auto v = req[f];
        return std::string_view(v.data(), v.size());
      };
      const TokenFrom from = token_shown(c_.o.token, header(http::field::authorization),
                                         header(http::field::cookie), request.query);
      if (from == TokenFrom::none) {
        c_.unauthorized.fetch_add(1);
        HttpResponse no = plain(401, "a token is required (Authorization: Bearer, or ?token=)\n");
        no.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ddprun\"");
        reply(std::move(no), !keep);
        return;
      }
      HttpResponse r = call(request);
      if (from == TokenFrom::query) r.headers.emplace_back("Set-Cookie", token_cookie(c_.o.token));
      reply(std::move(r), !keep);
      return;
    }
    reply(call(request), !keep);
  }

  HttpResponse call(const HttpRequest& request) {
    try {
      HttpResponse r = c_.handler(request);
      if (valid(r)) return r;
      ddp::logger("http").warn("the handler for {} gave status {} or a bad content type",
                               request.path, r.status);
    } catch (const std::exception& e) {
      ddp::logger("http").warn("the handler for {} failed: {}", request.path, e.what());
    } catch (...) {
      ddp::logger("http").warn("the handler for {} failed", request.path);
    }
    c_.handler_errors.fetch_add(1);
    return plain(500, "internal error\n");
  }

  void reply(HttpResponse r, bool close, bool allow = false) {
    res_.emplace(static_cast<http::status>(r.status), version_);
    res_->set(http::field::content_type, r.content_type);
    res_->set(http::field::cache_control, "no-store");
    res_->set("X-Content-Type-Options", "nosniff");
    if (allow) res_->set(http::field::allow, "GET, HEAD");
    for (const auto& [name, value] : r.headers) res_->insert(name, value);
    const std::size_t length = r.body.size();
    if (!head_) res_->body() = std::move(r.body);
    res_->content_length(length);
    res_->keep_alive(!close);
    close_after_ = close;
    tcp().expires_after(c_.o.write_timeout);
    http::async_write(
        stream_, *res_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_written(ec); });
  }

  void on_written(beast::error_code ec) {
    res_.reset();
    if (ec) return;
    c_.requests.fetch_add(1);
    if (close_after_) {
      linger();
    } else {
      read_head();
    }
  }

  // Half-closes, then reads and drops what the client still sends (bounded in bytes and time)
  // so that closing with unread input does not reset the connection before the reply is read.
  void linger() {
    beast::error_code ignored;
    tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
    tcp().expires_after(std::min<std::chrono::milliseconds>(c_.o.request_timeout, kMaxLinger));
    drain();
  }

  void drain() {
    stream_.async_read_some(asio::buffer(discard_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->drained_ += n;
                              if (!ec && self->drained_ < kMaxDrain) self->drain();
                            });
  }

  Core& c_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  std::optional<http::response<http::string_body>> res_;
  unsigned version_ = 11;
  bool head_ = false;
  bool close_after_ = false;
  std::size_t drained_ = 0;
  std::array<char, 2048> discard_{};
};

// Waits for the listener to be readable, then takes what is queued with accept4 so that every
// connection is close-on-exec from its first instant.
void Core::accept() {
  acceptor->async_wait(tcp::acceptor::wait_read, [this](const beast::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    int err = 0;
    for (int i = 0; i < 64 && !ec; ++i) {  // a burst; the rest on the next turn
      const int fd = ::accept4(acceptor->native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        adopt(fd);
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        err = errno;
      }
      break;
    }
    if (ec || err != 0) {  // EMFILE and friends: back off instead of spinning
      ddp::logger("http").warn("accept failed: {}; retrying",
                               ec ? ec.message() : std::string(std::strerror(err)));
      accept_retry->expires_after(kAcceptRetry);
      accept_retry->async_wait([this](const beast::error_code& e) {
        if (!e) accept();
      });
      return;
    }
    accept();
  });
}

void Core::adopt(int fd) {
  if (sessions.size() >= o.max_connections) {
    refused.fetch_add(1);
    const auto& r = busy_reply();
    [[maybe_unused]] auto sent = ::send(fd, r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(fd);
    return;
  }
  tcp::socket s(io);
  beast::error_code ec;
  s.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return;
  }
  s.set_option(tcp::no_delay(true), ec);
  if (tls) {
    using Tls = beast::ssl_stream<beast::tcp_stream>;
    std::make_shared<Session<Tls>>(*this, Tls(beast::tcp_stream(std::move(s)), *tls))->start();
  } else {
    std::make_shared<Session<beast::tcp_stream>>(*this, beast::tcp_stream(std::move(s)))->start();
  }
}

// HTTPS: the certificate chain and its key, TLS 1.2 or later; ConfigError naming the file.
asio::ssl::context server_tls(const HttpOptions& o) {
  for (const std::string* f : {&o.tls_cert, &o.tls_key}) {
    if (::access(f->c_str(), R_OK) != 0) {
      DDP_THROW(ConfigError, "the HTTPS " +
                                 std::string(f == &o.tls_cert ? "certificate " : "key ") + *f +
                                 " cannot be read: " + std::strerror(errno));
    }
  }
  asio::ssl::context ctx(asio::ssl::context::tls_server);
  ::SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  beast::error_code ec;
  ctx.use_certificate_chain_file(o.tls_cert, ec);
  if (ec) {
    DDP_THROW(ConfigError,
              "the HTTPS certificate " + o.tls_cert + " cannot be used: " + ec.message());
  }
  ctx.use_private_key_file(o.tls_key, asio::ssl::context::pem, ec);
  if (ec) {
    DDP_THROW(ConfigError, "the HTTPS key " + o.tls_key + " cannot be used (is it the key of " +
                               o.tls_cert + "?): " + ec.message());
  }
  return ctx;
}

}  // namespace

struct HttpServer::Impl : Core {
  using Core::Core;
};

HttpServer::HttpServer(HttpOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  auto& c = *impl_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.started || c.stopped) DDP_THROW(ConfigError, "the HTTP server can be started only once");
  const std::string where = c.o.host + ":" + std::to_string(c.o.port);
  if (c.o.max_connections == 0 || c.o.max_request_bytes == 0) {
    DDP_THROW(ConfigError, "the HTTP server on " + where +
                               " needs max_connections and max_request_bytes above 0");
  }
  if (!c.o.tls_cert.empty()) c.tls.emplace(server_tls(c.o));
  beast::error_code ec;
  tcp::resolver resolver(c.io);
  auto results = resolver.resolve(c.o.host, std::to_string(c.o.port),
                                  tcp::resolver::numeric_service | tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    DDP_THROW(IoError, "cannot listen for HTTP on " + where + ": cannot resolve '" + c.o.host +
                           "': " + ec.message());
  }
  const tcp::endpoint ep = results.begin()->endpoint();
  const int lfd =
      ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (lfd < 0) {
    DDP_THROW(IoError, "cannot listen for HTTP on " + where + ": " + std::strerror(errno));
  }
  c.protocol = ep.protocol();
  c.acceptor.emplace(c.io);
  c.acceptor->assign(c.protocol, lfd, ec);
  if (!ec) c.acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec && ep.address().is_v6()) c.acceptor->set_option(asio::ip::v6_only(false), ec);
  if (!ec) c.acceptor->bind(ep, ec);
  if (!ec) c.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    c.acceptor->close(ignored);
    DDP_THROW(IoError, "cannot listen for HTTP on " + where + ": " + ec.message());
  }
  c.port = c.acceptor->local_endpoint().port();
  c.accept_retry.emplace(c.io);
  c.accept();
  c.started = true;
  c.thread = std::thread([&c] {
    for (;;) {
      try {
        c.io.run();
        return;
      } catch (const std::exception& e) {  // an allocation failure, say: keep serving
        ddp::logger("http").error("HTTP server loop: {}", e.what());
      }
    }
  });
}

void HttpServer::stop() {
  auto& c = *impl_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.stopped) return;
  c.stopped = true;
  if (!c.started) return;
  c.io.stop();
  if (c.thread.joinable()) c.thread.join();
  // The loop is over: close everything here; the handlers still queued (holding the sessions)
  // are destroyed with the io_context.
  beast::error_code ignored;
  c.acceptor->close(ignored);
  c.accept_retry->cancel();
  for (SessionBase* s : c.sessions) s->close_now();
}

std::uint16_t HttpServer::port() const { return impl_->port.load(); }

HttpStats HttpServer::stats() const {
  const auto& c = *impl_;
  HttpStats st;
  st.connections_open = c.open.load();
  st.connections_total = c.total.load();
  st.connections_refused = c.refused.load();
  st.requests = c.requests.load();
  st.timeouts = c.timeouts.load();
  st.rejected = c.rejected.load();
  st.handler_errors = c.handler_errors.load();
  st.unauthorized = c.unauthorized.load();
  return st;
}

}  // namespace ddp::status
