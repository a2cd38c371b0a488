// StoreClient's dialer: the one way every ddprun client reaches a store. Resolves the host,
// connects to each address without blocking, retries with exponential backoff and jitter until
// connect_timeout, gives up at once when the cancel fd is readable, then sends VALIDATE and
// HELLO; a server that closes at HELLO is not a ddprun store (ProtocolError). With TLS, the
// handshake comes first, bounded by the same deadline.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "client_io.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/opcodes.hpp"
#include "ddp/proto/writer.hpp"
#include "ddp/rdzv/client.hpp"

namespace ddp::rdzv {

namespace {

bool connected_to_itself(int fd) {
  sockaddr_storage mine{}, peer{};
  socklen_t a = sizeof(mine), b = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0 || a != b) {
    return false;
  }
  return std::memcmp(&mine, &peer, a) == 0;
}

// One non-blocking connect attempt to `ai`, bounded by `deadline` and `cancel_fd`. Returns the
// fd, or -1 (err says why).
int try_connect(const addrinfo* ai, Clock::time_point deadline, int cancel_fd, std::string& err) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    err = std::strerror(errno);
    return -1;
  }
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
    err = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  pollfd p[2] = {{fd, POLLOUT, 0}, {cancel_fd, POLLIN, 0}};
  int r = ::poll(p, 2, std::max(1, remaining_ms(deadline)));
  if (r > 0 && p[1].revents != 0) {
    err = "interrupted";
    ::close(fd);
    return -1;
  }
  int soerr = 0;
  socklen_t len = sizeof(soerr);
  if (r <= 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
    err = r == 0 ? "connect timed out" : std::strerror(soerr ? soerr : errno);
    ::close(fd);
    return -1;
  }
  if (connected_to_itself(fd)) {
    // Nothing listens on a port of the ephemeral range, and the kernel chose that very port
    // for this socket (TCP's simultaneous open): it would read its own requests as replies.
    err = "no store listens there (the socket connected to itself)";
    ::close(fd);
    return -1;
  }
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

StoreClient::StoreClient(std::string host, std::uint16_t port, ClientOptions options)
    : host_(std::move(host)), port_(port), opts_(options) {
  endpoint_ = Endpoint{host_, port_}.str();
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) DDP_THROW(IoError, std::string("eventfd failed: ") + std::strerror(errno));
  try {
    connect();
  } catch (...) {
    ::close(wake_fd_);
    throw;
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
  ::close(wake_fd_);
}

void StoreClient::interrupt() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

void StoreClient::connect() {
  auto give_up = Clock::now() + opts_.connect_timeout;
  std::mt19937 rng(std::random_device{}());
  auto backoff = std::chrono::milliseconds(10);
  std::string err;
  int attempts = 0;
  while (true) {
    ++attempts;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0) {
      err = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    } else {
      for (auto* ai = res; ai && fd_ < 0; ai = ai->ai_next) {
        fd_ = try_connect(ai, give_up, opts_.cancel_fd, err);
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (Clock::now() + backoff >= give_up) {
      DDP_THROW(IoError, "cannot connect to the store at " + endpoint_ + " after " +
                             std::to_string(attempts) + " attempts in " +
                             std::to_string(opts_.connect_timeout.count()) + " ms: " + err);
    }
    // Exponential backoff with jitter, so a thousand agents do not retry in lockstep; the wait
    // ends early when cancel_fd becomes readable.
    std::uniform_int_distribution<long> jitter(0, backoff.count());
    pollfd cancel{opts_.cancel_fd, POLLIN, 0};
    const auto pause = backoff + std::chrono::milliseconds(jitter(rng));
    if ((::poll(&cancel, 1, static_cast<int>(pause.count())) > 0 && cancel.revents != 0) ||
        err == "interrupted") {
      DDP_THROW(IoError, "store " + endpoint_ + ": connecting interrupted");
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (opts_.tls) start_tls(give_up);
  handshake();
}

// The TLS handshake over the connected socket, which stays non-blocking from here on (every
// read and write then polls: client.cpp's io_send/io_recv).
void StoreClient::start_tls(Clock::time_point give_up) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  try {
    tls_ = std::make_unique<TlsSession>(*opts_.tls, fd_, host_, "store " + endpoint_);
    while (const short events = tls_->handshake()) {
      pollfd p[2] = {{fd_, events, 0}, {opts_.cancel_fd, POLLIN, 0}};
      const int r = ::poll(p, 2, remaining_ms(give_up));
      if (r > 0 && p[1].revents != 0) DDP_THROW(IoError, "connecting interrupted");
      if (r == 0) DDP_THROW(IoError, "the TLS handshake did not finish in time");
    }
  } catch (const IoError& e) {
    ::close(fd_);
    fd_ = -1;
    DDP_THROW(IoError, "store " + endpoint_ + ": " + e.what());
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

// VALIDATE, then HELLO; from version 2 the HELLO reply carries the store's challenge, which
// AUTH answers. AUTH is sent with the first request and its reply read before that request's
// (finish_auth), so authenticating costs no round trip and no segment of its own.
void StoreClient::handshake() {
  buf_.clear();
  Writer w(buf_);
  w.op(Dialect::v2, Op::validate).value<std::uint32_t>(proto::kValidateMagic);
  if (opts_.extensions) w.op(Dialect::v2, Op::hello).value<std::uint32_t>(proto::kExtensionVersion);
  send_request();
  if (!opts_.extensions) return;
  std::string challenge;
  try {
    expect_reply(deadline());
    std::uint32_t version = 0;
    read_exact(&version, sizeof(version), deadline());
    if (version >= proto::auth::kAuthVersion) challenge = read_bytes();
  } catch (const IoError&) {
    if (!peer_closed_) throw;
    DDP_THROW(ProtocolError, "the server at " + endpoint_ +
                                 " answers, but closed the connection at ddprun's handshake: it "
                                 "is not a ddprun store (a torch TCPStore?)");
  }
  if (opts_.secret.empty() || challenge.empty()) return;
  const std::string mine = proto::auth::nonce();
  const proto::auth::Key key(opts_.secret);
  Writer(buf_)
      .op(Dialect::v2, Op::auth)
      .bytes(mine)
      .bytes(proto::auth::client_proof(key, mine, challenge));
  // Left in buf_: it goes out in one segment with the first request (one read and one write
  // for both on each side).
  auth_expect_ = proto::auth::server_proof(key, mine, challenge);
}

void StoreClient::finish_auth() {
  const std::string expect = std::move(auth_expect_);
  auth_expect_.clear();
  std::uint8_t status = 0;
  read_exact(&status, 1, deadline());
  if (status != proto::kReplyOk) {
    std::string msg = status == proto::kReplyError ? read_bytes() : "unknown reply status";
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    DDP_THROW(ProtocolError, "store " + endpoint_ + " refused authentication: " + msg);
  }
  const std::string proof = read_bytes();
  if (!proto::auth::same(proof, expect)) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    DDP_THROW(ProtocolError, "store " + endpoint_ +
                                 " answered authentication with a wrong proof: it does not hold "
                                 "the job's secret");
  }
}

}  // namespace ddp::rdzv
