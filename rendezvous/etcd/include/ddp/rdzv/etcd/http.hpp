// The etcd client's transport: HTTP/1.1 POSTs to etcd's JSON gateway over plain POSIX sockets
// (as StoreClient: no Asio on the client side), or over TLS on them for https:// members
// (tls.hpp), every call bounded by a deadline and a cancel fd. One keep-alive connection to one
// member at a time; a member that cannot be reached, has no leader (the "Grpc-Metadata-hasleader:
// true" header makes it say so at once) or times out is left for the next one, until the request's
// timeout. Streams (watch) get a connection of their own and hand out one line (message) at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/rdzv/endpoint.hpp"
#include "ddp/rdzv/tls.hpp"

namespace ddp::rdzv::etcd {

using Clock = std::chrono::steady_clock;

struct EtcdOptions {
  std::vector<Endpoint> endpoints;                  // etcd members (client URLs)
  std::chrono::milliseconds timeout{15000};         // one request, every member tried
  std::chrono::milliseconds connect_timeout{2000};  // one connect attempt to one member
  std::string user, password;                       // etcd auth (empty: none)
  int cancel_fd = -1;                               // readable: give up at once (IoError)
  TlsOptions tls;                                   // https:// members
};

// "h1:2379,https://h2:2379" -> endpoints (ConfigError naming the bad one; at most 64). A
// member may say http:// or https://; *https (when given) is whether they said https://, and
// members that mix the two are refused.
std::vector<Endpoint> parse_etcd_endpoints(std::string_view text, bool* https = nullptr);
// "h1:2379,h2:2379", as messages name the members.
std::string endpoints_text(const std::vector<Endpoint>& endpoints);

class Connection;
class ResponseReader;

class EtcdHttp {
 public:
  explicit EtcdHttp(EtcdOptions options);
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  // POST /v3/<path> (path without the /v3/), the 200 answer's body. Throws ddp::IoError when no
  // member answered in time (naming the endpoints and the last error: the cluster is away, as
  // a TCP store whose connection failed; ddp::TimeoutError stays a WAIT's own timeout),
  // ddp::ProtocolError with etcd's message for a refused request (4xx).
  std::string post(std::string_view path, std::string_view body);

  // Requests sent, watch streams opened included (retries on another member too), for the O(1)
  // tests.
  std::uint64_t requests() const { return requests_; }
  const EtcdOptions& options() const { return opts_; }
  // Whether the cancel fd is readable (the caller gives up rather than retries).
  bool cancelled() const;
  const std::string& token() const { return token_; }   // the auth token, when user is set
  const TlsContext* tls() const { return tls_.get(); }  // null: plain http

 private:
  std::string post_once(Connection& c, std::string_view path, std::string_view body,
                        Clock::time_point deadline, int& status);
  void authenticate(Clock::time_point deadline);

  EtcdOptions opts_;
  std::unique_ptr<TlsContext> tls_;
  std::unique_ptr<Connection> conn_;
  std::size_t member_ = 0;  // the member conn_ is (or will be) connected to
  std::string token_;
  mutable std::uint64_t requests_ = 0;  // posts and watch streams opened (EtcdStream counts)
  friend class EtcdStream;
};

// One streaming POST (a watch) on a connection of its own, to the first member that answers.
class EtcdStream {
 public:
  EtcdStream(const EtcdHttp& client, std::string_view path, std::string_view body);
  ~EtcdStream();
  EtcdStream(const EtcdStream&) = delete;
  EtcdStream& operator=(const EtcdStream&) = delete;

  // The next line of the stream, or nullopt when `deadline` came first (the stream stays
  // usable). Throws ddp::IoError when the stream ended or broke (an error line etcd sent last,
  // without a newline, is returned first).
  std::optional<std::string> next_line(Clock::time_point deadline);

 private:
  std::unique_ptr<Connection> conn_;
  std::unique_ptr<ResponseReader> reader_;
  std::string lines_;  // decoded body not yet split
};

}  // namespace ddp::rdzv::etcd
