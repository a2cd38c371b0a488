// etcd's HTTP transport (etcd/http.hpp): non-blocking connect and poll-bounded reads and writes
// on plain sockets or TLS over them (tls.hpp), responses parsed by ResponseReader, members
// tried in turn.
#include "ddp/rdzv/etcd/http.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/etcd/api.hpp"
#include "ddp/rdzv/etcd/http_reader.hpp"

namespace ddp::rdzv::etcd {

namespace {

constexpr std::size_t kMaxEndpoints = 64;
constexpr std::size_t kMaxBody = 64u << 20;  // a unary answer (a range of every key at most)

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

}  // namespace

std::string endpoints_text(const std::vector<Endpoint>& eps) {
  std::string s;
  for (const auto& e : eps) s += (s.empty() ? "" : ",") + e.str();
  return s;
}

std::vector<Endpoint> parse_etcd_endpoints(std::string_view text, bool* https) {
  std::vector<Endpoint> out;
  std::size_t at = 0;
  int secure = -1;  // not said yet; 0: http://, 1: https://
  while (at <= text.size()) {
    auto comma = text.find(',', at);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view one = text.substr(at, comma - at);
    for (std::string_view scheme : {"http://", "https://"}) {
      if (one.substr(0, scheme.size()) == scheme) {
        const int said = scheme == "https://" ? 1 : 0;
        if (secure >= 0 && secure != said) {
          throw ConfigError("etcd endpoint '" + std::string(one) +
                            "': the members mix http:// and https://; a cluster speaks one");
        }
        secure = said;
        one.remove_prefix(scheme.size());
      }
    }
    if (!one.empty() && one.back() == '/') one.remove_suffix(1);
    out.push_back(parse_endpoint(one, 2379, "etcd endpoint"));
    if (out.size() > kMaxEndpoints) {
      throw ConfigError("--rdzv-endpoint lists more than " + std::to_string(kMaxEndpoints) +
                        " etcd members");
    }
    at = comma + 1;
  }
  if (https != nullptr) *https = secure == 1;
  return out;
}

// One socket to one member, with a reader for the response in progress.
class Connection {
 public:
  Connection(const Endpoint& ep, Clock::time_point deadline, int cancel_fd, const TlsContext* tls)
      : ep_(ep), cancel_fd_(cancel_fd) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(ep.port);
    if (int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      DDP_THROW(IoError, "etcd " + ep.str() + ": cannot resolve: " + ::gai_strerror(rc));
    }
    std::string err = "no address";
    for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next)
      fd_ = try_connect(ai, deadline, err);
    ::freeaddrinfo(res);
    if (fd_ < 0) DDP_THROW(IoError, "etcd " + ep.str() + ": " + err);
    if (tls != nullptr) {
      try {
        tls_ = std::make_unique<TlsSession>(*tls, fd_, ep.host, "etcd " + ep.str());
        while (const short events = tls_->handshake()) {
          wait_for(events, deadline,
                   "in the TLS handshake (no answer: a plain http:// member, or a stopped one?)");
        }
      } catch (...) {
        tls_.reset();
        ::close(fd_);
        throw;
      }
    }
  }
  ~Connection() {
    tls_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const Endpoint& endpoint() const { return ep_; }

  void send(std::string_view bytes, Clock::time_point deadline) {
    while (tls_ && !bytes.empty()) {
      const long n = tls_->write(bytes.data(), bytes.size());
      if (n == 0) DDP_THROW(IoError, "etcd " + ep_.str() + ": the connection was closed");
      if (n < 0) {
        wait_for(static_cast<short>(-n), deadline, "sending");
        continue;
      }
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    while (!bytes.empty()) {
      wait_for(POLLOUT, deadline, "sending");
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) DDP_THROW(IoError, "etcd " + ep_.str() + ": send: " + std::strerror(errno));
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // Reads what is there into the reader; false when the deadline came first. Throws IoError on
  // EOF before the response is complete.
  bool read_some(ResponseReader& r, Clock::time_point deadline) {
    char buf[65536];
    if (tls_) {
      if (!tls_->pending() && !wait_for(POLLIN, deadline, nullptr)) return false;
      const long n = tls_->read(buf, sizeof buf);
      if (n == 0) DDP_THROW(IoError, "etcd " + ep_.str() + ": the connection was closed");
      if (n == -POLLOUT) wait_for(POLLOUT, deadline, nullptr);
      if (n > 0) r.feed(std::string_view(buf, static_cast<std::size_t>(n)));
      return true;  // n == -POLLIN: TLS records without data (a session ticket)
    }
    if (!wait_for(POLLIN, deadline, nullptr)) return false;
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n < 0) DDP_THROW(IoError, "etcd " + ep_.str() + ": recv: " + std::strerror(errno));
    if (n == 0) DDP_THROW(IoError, "etcd " + ep_.str() + ": the connection was closed");
    r.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    return true;
  }

 private:
  int try_connect(const addrinfo* ai, Clock::time_point deadline, std::string& err) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      err = std::strerror(errno);
      return -1;
    }
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      err = std::string("connect: ") + std::strerror(errno);
      ::close(fd);
      return -1;
    }
    pollfd p[2] = {{fd, POLLOUT, 0}, {cancel_fd_, POLLIN, 0}};
    const int r = ::poll(p, cancel_fd_ >= 0 ? 2 : 1, std::max(1, ms_left(deadline)));
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (r > 0 && cancel_fd_ >= 0 && p[1].revents != 0) {
      err = "interrupted";
    } else if (r <= 0) {
      err = "connect timed out";
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
      err = std::string("connect: ") + std::strerror(soerr != 0 ? soerr : errno);
    } else {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    ::close(fd);
    return -1;
  }

  // Waits until fd_ is ready for `events`; false at the deadline (or throws TimeoutError naming
  // `doing` when it is set); IoError when the cancel fd is readable.
  bool wait_for(short events, Clock::time_point deadline, const char* doing) {
    for (;;) {
      pollfd p[2] = {{fd_, events, 0}, {cancel_fd_, POLLIN, 0}};
      const int r = ::poll(p, cancel_fd_ >= 0 ? 2 : 1, ms_left(deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) DDP_THROW(IoError, std::string("etcd: poll: ") + std::strerror(errno));
      if (r > 0 && cancel_fd_ >= 0 && p[1].revents != 0) {
        DDP_THROW(IoError, "etcd " + ep_.str() + ": interrupted");
      }
      if (r > 0) return true;
      if (doing != nullptr) DDP_THROW(TimeoutError, "etcd " + ep_.str() + ": timed out " + doing);
      return false;
    }
  }

  Endpoint ep_;
  int cancel_fd_;
  int fd_ = -1;
  std::unique_ptr<TlsSession> tls_;  // https:// members
};

namespace {

std::string request_text(const Endpoint& ep, std::string_view path, std::string_view body,
                         const std::string& token) {
  std::string r =
      "POST /v3/" + std::string(path) + " HTTP/1.1\r\nHost: " + ep.str() +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nGrpc-Metadata-hasleader: true\r\n";
  if (!token.empty()) r += "Authorization: " + token + "\r\n";
  r += "\r\n";
  r.append(body);
  return r;
}

// Unavailable (no leader, timed out, deadline exceeded): worth another member.
bool retryable(int status) {
  return status == 503 || status == 500 || status == 504 || status == 502;
}

}  // namespace

EtcdHttp::EtcdHttp(EtcdOptions options) : opts_(std::move(options)) {
  if (opts_.endpoints.empty()) throw ConfigError("etcd: no endpoint given");
  if (opts_.tls.on) tls_ = std::make_unique<TlsContext>(opts_.tls);
}

EtcdHttp::~EtcdHttp() = default;

std::string EtcdHttp::post_once(Connection& c, std::string_view path, std::string_view body,
                                Clock::time_point deadline, int& status) {
  ++requests_;
  c.send(request_text(c.endpoint(), path, body, token_), deadline);
  ResponseReader r;
  std::string out;
  while (!r.complete()) {
    if (!c.read_some(r, deadline)) {
      DDP_THROW(TimeoutError, "etcd " + c.endpoint().str() + ": no answer to /v3/" +
                                  std::string(path) + " in time");
    }
    out += r.take_body();
    if (out.size() > kMaxBody) {
      DDP_THROW(ProtocolError, "etcd " + c.endpoint().str() + ": an answer over " +
                                   std::to_string(kMaxBody) + " bytes");
    }
  }
  status = r.status();
  if (!r.keep_alive()) conn_.reset();
  return out;
}

void EtcdHttp::authenticate(Clock::time_point deadline) {
  token_.clear();
  int status = 0;
  std::string body = post_once(*conn_, "auth/authenticate", auth_body(opts_.user, opts_.password),
                               deadline, status);
  if (status != 200) {
    throw ConfigError("etcd " + opts_.endpoints[member_].str() + ": user '" + opts_.user +
                      "' could not authenticate: " + error_message(body));
  }
  token_ = parse_auth_token(body);
}

std::string EtcdHttp::post(std::string_view path, std::string_view body) {
  const auto deadline = Clock::now() + opts_.timeout;
  std::string last = "not tried";
  std::size_t failed_in_a_row = 0;
  auto backoff = std::chrono::milliseconds(20);
  bool reauthenticated = false;
  while (Clock::now() < deadline) {
    const Endpoint& ep = opts_.endpoints[member_];
    try {
      if (!conn_) {
        conn_ = std::make_unique<Connection>(
            ep, std::min(deadline, Clock::now() + opts_.connect_timeout), opts_.cancel_fd,
            tls_.get());
        if (!opts_.user.empty() && token_.empty()) authenticate(deadline);
      }
      int status = 0;
      std::string answer = post_once(*conn_, path, body, deadline, status);
      if (status == 200) return answer;
      if (status == 401 && !opts_.user.empty() && !reauthenticated) {
        reauthenticated = true;  // the token expired: once more with a fresh one
        token_.clear();
        if (conn_) authenticate(deadline);  // else at the reconnect
        continue;
      }
      const std::string msg = error_message(answer);
      if (!retryable(status)) {
        DDP_THROW(ProtocolError, "etcd " + ep.str() + " refused /v3/" + std::string(path) + ": " +
                                     (msg.empty() ? "HTTP " + std::to_string(status) : msg));
      }
      last = ep.str() + ": " + (msg.empty() ? "HTTP " + std::to_string(status) : msg);
    } catch (const ProtocolError&) {
      throw;
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& e) {  // IoError, TimeoutError: this member is down or cut off
      if (cancelled()) throw;
      last = e.what();
    }
    conn_.reset();
    token_.clear();
    member_ = (member_ + 1) % opts_.endpoints.size();
    if (++failed_in_a_row >= opts_.endpoints.size()) {  // every member once: back off a little
      failed_in_a_row = 0;
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
          backoff, std::chrono::milliseconds(ms_left(deadline))));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
  }
  DDP_THROW(IoError, "etcd: no member of " + endpoints_text(opts_.endpoints) + " answered /v3/" +
                         std::string(path) + " within " + std::to_string(opts_.timeout.count()) +
                         " ms (last: " + last + ")");
}

bool EtcdHttp::cancelled() const {
  if (opts_.cancel_fd < 0) return false;
  pollfd p{opts_.cancel_fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && p.revents != 0;
}

EtcdStream::EtcdStream(const EtcdHttp& client, std::string_view path, std::string_view body) {
  const auto& o = client.options();
  const auto deadline = Clock::now() + o.timeout;
  std::string last = "not tried";
  for (std::size_t i = 0; Clock::now() < deadline; ++i) {
    const Endpoint& ep = o.endpoints[i % o.endpoints.size()];
    try {
      conn_ = std::make_unique<Connection>(ep, std::min(deadline, Clock::now() + o.connect_timeout),
                                           o.cancel_fd, client.tls());
      ++client.requests_;
      conn_->send(request_text(ep, path, body, client.token()), deadline);
      ResponseReader r;
      while (!r.headers_done()) {
        if (!conn_->read_some(r, deadline)) DDP_THROW(TimeoutError, "no answer in time");
      }
      if (r.status() == 200) {
        reader_ = std::make_unique<ResponseReader>(std::move(r));
        lines_ = reader_->take_body();
        return;
      }
      std::string answer = r.take_body();
      while (!r.complete() && conn_->read_some(r, deadline)) answer += r.take_body();
      const std::string msg = error_message(answer);
      if (!retryable(r.status())) {
        DDP_THROW(ProtocolError, "etcd " + ep.str() + " refused /v3/" + std::string(path) + ": " +
                                     (msg.empty() ? "HTTP " + std::to_string(r.status()) : msg));
      }
      last = ep.str() + ": " + msg;
    } catch (const ProtocolError&) {
      throw;
    } catch (const ConfigError&) {  // TLS: not trusted, refused, not TLS
      throw;
    } catch (const Error& e) {
      if (client.cancelled()) throw;
      last = e.what();
    }
    conn_.reset();
    if ((i + 1) % o.endpoints.size() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  DDP_THROW(IoError, "etcd: no member of " + endpoints_text(o.endpoints) + " opened /v3/" +
                         std::string(path) + " within " + std::to_string(o.timeout.count()) +
                         " ms (last: " + last + ")");
}

EtcdStream::~EtcdStream() = default;

std::optional<std::string> EtcdStream::next_line(Clock::time_point deadline) {
  for (;;) {
    if (const auto nl = lines_.find('\n'); nl != std::string::npos) {
      std::string line = lines_.substr(0, nl);
      lines_.erase(0, nl + 1);
      return line;
    }
    if (reader_->complete()) break;
    try {
      if (!conn_->read_some(*reader_, deadline)) return std::nullopt;
    } catch (const IoError&) {
      if (lines_.empty()) throw;
      break;
    }
    lines_ += reader_->take_body();
    if (lines_.size() > kMaxBody) DDP_THROW(ProtocolError, "etcd: a stream message over 64 MiB");
  }
  if (!lines_.empty()) {  // etcd's last word (an error object without a newline)
    std::string line;
    line.swap(lines_);
    return line;
  }
  DDP_THROW(IoError, "etcd " + conn_->endpoint().str() + ": the stream ended");
}

}  // namespace ddp::rdzv::etcd
