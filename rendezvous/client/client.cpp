// StoreClient's requests over POSIX sockets, plain or through TLS (connecting is dialer.cpp's):
// every read bounded by poll() against a deadline, torch's WAIT/CANCEL_WAIT dance on timeout.
#include "ddp/rdzv/client.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "client_io.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/opcodes.hpp"
#include "ddp/proto/writer.hpp"

namespace ddp::rdzv {

Clock::time_point StoreClient::deadline() const { return Clock::now() + opts_.timeout; }

void StoreClient::broken(const std::string& why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  DDP_THROW(IoError, "store " + endpoint_ + ": " + why);
}

// A send failed because the server closed the connection. Requests without a reply (SET,
// APPEND, ...) never read, so the server's reason may still sit unread in the socket: after
// HELLO every reply was consumed, so whatever is buffered can only be that error reply.
void StoreClient::rethrow_refusal() {
  if (!opts_.extensions || fd_ < 0) return;
  // What was read ahead of the last reply (in_), then what the socket holds.
  char buf[4096];
  ssize_t n = static_cast<ssize_t>(std::min(in_.size() - in_pos_, sizeof(buf)));
  std::memcpy(buf, in_.data() + in_pos_, static_cast<std::size_t>(n));
  ssize_t more = -1;
  if (!tls_) {
    more = ::recv(fd_, buf + n, sizeof(buf) - static_cast<std::size_t>(n), MSG_DONTWAIT);
  } else {
    try {
      more = tls_->read(buf + n, sizeof(buf) - static_cast<std::size_t>(n));
    } catch (const Error&) {
    }
  }
  if (more > 0) n += more;
  if (n < 9 || static_cast<std::uint8_t>(buf[0]) != proto::kReplyError) return;
  std::uint64_t len = 0;
  std::memcpy(&len, buf + 1, sizeof(len));
  if (len > static_cast<std::uint64_t>(n) - 9) return;
  std::string msg(buf + 9, static_cast<std::size_t>(len));
  ::close(fd_);
  fd_ = -1;
  DDP_THROW(ProtocolError, "store " + endpoint_ + " refused a request: " + msg);
}

// Waits (bounded) until the socket can do `events`: TLS's reads and writes on the
// non-blocking socket.
void StoreClient::wait_io(short events, Clock::time_point deadline) {
  while (true) {
    pollfd p[2] = {{fd_, events, 0}, {wake_fd_, POLLIN, 0}};
    const int r = ::poll(p, 2, remaining_ms(deadline));
    if (r > 0 && p[1].revents != 0) broken("interrupted");
    if (r > 0) return;
    if (r == 0) broken("no progress within " + std::to_string(opts_.timeout.count()) + " ms");
    if (errno != EINTR) broken(std::string("poll failed: ") + std::strerror(errno));
  }
}

long StoreClient::io_send(const char* p, std::size_t n) {
  if (!tls_) return ::send(fd_, p, n, MSG_NOSIGNAL);
  const auto until = deadline();
  try {
    while (true) {
      const long r = tls_->write(p, n);
      if (r > 0) return r;
      if (r == 0) {
        errno = EPIPE;
        return -1;
      }
      wait_io(static_cast<short>(-r), until);
    }
  } catch (const IoError& e) {
    broken(e.what());
  }
}

long StoreClient::io_recv(char* p, std::size_t n) {
  if (!tls_) return ::recv(fd_, p, n, 0);
  try {
    const long r = tls_->read(p, n);
    if (r == -POLLOUT) {  // the session must write first (a key update): then read again
      wait_io(POLLOUT, deadline());
      errno = EAGAIN;
      return -1;
    }
    if (r < 0) errno = EAGAIN;
    return r < 0 ? -1 : r;
  } catch (const IoError& e) {
    broken(e.what());
  }
}

void StoreClient::send_request() {
  if (fd_ < 0) broken("connection already closed by an earlier error");
  std::size_t off = 0;
  while (off < buf_.size()) {
    ssize_t n = io_send(buf_.data() + off, buf_.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = std::string("send failed: ") + std::strerror(errno);
      rethrow_refusal();
      broken(why);
    }
    off += static_cast<std::size_t>(n);
  }
  buf_.clear();
}

// With TLS, OpenSSL may hold whole records the socket no longer shows: peek() asks it first,
// and says which event to poll for when nothing is there.
bool StoreClient::wait_readable(Clock::time_point deadline) {
  while (true) {
    short events = POLLIN;
    if (tls_) {
      long ready = 0;
      try {
        ready = tls_->peek();
      } catch (const IoError& e) {
        broken(e.what());
      }
      if (ready >= 0) return true;  // data, or the close the next read reports
      events = static_cast<short>(-ready);
    }
    pollfd p[2] = {{fd_, events, 0}, {wake_fd_, POLLIN, 0}};
    int r = ::poll(p, 2, remaining_ms(deadline));
    if (r > 0 && p[1].revents != 0) broken("interrupted");
    if (r > 0 && tls_) continue;
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) broken(std::string("poll failed: ") + std::strerror(errno));
  }
}

// Replies are read through a small buffer: a reply's fields (status, length, bytes) and the
// replies that arrived together take one recv, not one each. A read of at least a chunk goes
// straight into `dst`.
void StoreClient::read_exact(void* dst, std::size_t n, Clock::time_point deadline) {
  constexpr std::size_t kChunk = 4096;
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    if (in_pos_ < in_.size()) {
      const std::size_t take = std::min(n, in_.size() - in_pos_);
      std::memcpy(p, in_.data() + in_pos_, take);
      in_pos_ += take;
      p += take;
      n -= take;
      continue;
    }
    in_.clear();
    in_pos_ = 0;
    if (!wait_readable(deadline)) {
      broken("no reply within " + std::to_string(opts_.timeout.count()) + " ms");
    }
    const bool direct = n >= kChunk;
    if (!direct) in_.resize(kChunk);
    ssize_t r = direct ? io_recv(p, n) : io_recv(in_.data(), kChunk);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) {
      in_.clear();
      continue;
    }
    if (r == 0) {
      peer_closed_ = true;
      broken("the server closed the connection");
    }
    if (r < 0) broken(std::string("recv failed: ") + std::strerror(errno));
    if (direct) {
      p += r;
      n -= static_cast<std::size_t>(r);
    } else {
      in_.resize(static_cast<std::size_t>(r));
    }
  }
}

void StoreClient::expect_reply(Clock::time_point deadline) {
  if (!opts_.extensions) return;
  if (!auth_expect_.empty()) finish_auth();
  std::uint8_t status = 0;
  read_exact(&status, 1, deadline);
  if (status == proto::kReplyOk) return;
  std::string msg = status == proto::kReplyError ? read_bytes() : "unknown reply status";
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  DDP_THROW(ProtocolError, "store " + endpoint_ + " refused the request: " + msg);
}

std::uint8_t StoreClient::read_u8() {
  std::uint8_t v = 0;
  read_exact(&v, 1, deadline());
  return v;
}

std::int64_t StoreClient::read_i64() {
  std::int64_t v = 0;
  read_exact(&v, sizeof(v), deadline());
  return v;
}

std::string StoreClient::read_bytes() {
  std::uint64_t len = 0;
  read_exact(&len, sizeof(len), deadline());
  if (len > 1ull << 32) broken("reply announces " + std::to_string(len) + " bytes");
  std::string s(static_cast<std::size_t>(len), '\0');
  read_exact(s.data(), s.size(), deadline());
  return s;
}

void StoreClient::set(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::set).bytes(key).bytes(value);
  send_request();
  // No reply of its own: a refused authentication must not pass for a write done.
  if (!auth_expect_.empty()) finish_auth();
}

std::string StoreClient::get(std::string_view key) {
  std::lock_guard<std::mutex> g(mu_);
  wait_locked({std::string(key)}, opts_.timeout, "get");
  Writer(buf_).op(Dialect::v2, Op::get).bytes(key);
  send_request();
  expect_reply(deadline());
  return read_bytes();
}

std::int64_t StoreClient::add(std::string_view key, std::int64_t delta) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::add).bytes(key).value(delta);
  send_request();
  expect_reply(deadline());
  return read_i64();
}

std::string StoreClient::compare_set(std::string_view key, std::string_view expected,
                                     std::string_view desired) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::compare_set).bytes(key).bytes(expected).bytes(desired);
  send_request();
  expect_reply(deadline());
  return read_bytes();
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  Writer w(buf_);
  w.op(Dialect::v2, Op::check).value<std::uint64_t>(keys.size());
  for (const auto& k : keys) w.bytes(k);
  send_request();
  expect_reply(deadline());
  return read_u8() == proto::kCheckReady;
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, opts_.timeout); }

void StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> g(mu_);
  wait_locked(keys, timeout, "wait");
}

void StoreClient::wait_locked(const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout, std::string_view what) {
  Writer w(buf_);
  w.op(Dialect::v2, Op::wait).value<std::uint64_t>(keys.size());
  for (const auto& k : keys) w.bytes(k);
  send_request();
  await_stop(timeout, [&] { return std::string(what) + " on keys: " + join_keys(keys); });
}

// After WAIT or BARRIER: poll up to `timeout`; on expiry CANCEL_WAIT and drain: a STOP_WAITING
// that crossed the cancel on the wire is followed by WAIT_CANCELED (torch's TCPStore::doWait).
void StoreClient::await_stop(std::chrono::milliseconds timeout,
                             const std::function<std::string()>& describe) {
  if (wait_readable(Clock::now() + timeout)) {
    expect_reply(deadline());
    if (read_u8() != proto::kStopWaiting) broken("unexpected reply to " + describe());
    return;
  }
  Writer(buf_).op(Dialect::v2, Op::cancel_wait);
  send_request();
  expect_reply(deadline());
  std::uint8_t r = read_u8();
  if (r == proto::kStopWaiting) {
    expect_reply(deadline());
    r = read_u8();
  }
  if (r != proto::kWaitCanceled) broken("unexpected reply to CANCEL_WAIT");
  DDP_THROW(TimeoutError, describe() + " timed out after " + std::to_string(timeout.count()) +
                              " ms (store " + endpoint_ + ")");
}

bool StoreClient::delete_key(std::string_view key) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::delete_key).bytes(key);
  send_request();
  expect_reply(deadline());
  return read_i64() != 0;
}

std::int64_t StoreClient::num_keys() {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::num_keys);
  send_request();
  expect_reply(deadline());
  return read_i64();
}

void StoreClient::append(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::append).bytes(key).bytes(value);
  send_request();
  // No reply of its own: a refused authentication must not pass for a write done.
  if (!auth_expect_.empty()) finish_auth();
}

std::vector<std::string> StoreClient::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  wait_locked(keys, opts_.timeout, "multi_get");
  Writer w(buf_);
  w.op(Dialect::v2, Op::multi_get).value<std::uint64_t>(keys.size());
  for (const auto& k : keys) w.bytes(k);
  send_request();
  expect_reply(deadline());
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(read_bytes());
  return out;
}

void StoreClient::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    DDP_THROW(ConfigError, "multi_set: " + std::to_string(keys.size()) + " keys but " +
                               std::to_string(values.size()) + " values");
  }
  std::lock_guard<std::mutex> g(mu_);
  Writer w(buf_);
  w.op(Dialect::v2, Op::multi_set).value<std::int64_t>(static_cast<std::int64_t>(keys.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) w.bytes(keys[i]).bytes(values[i]);
  send_request();
  // No reply of its own: a refused authentication must not pass for a write done.
  if (!auth_expect_.empty()) finish_auth();
}

std::uint32_t StoreClient::ping(std::uint32_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::ping).value(nonce);
  send_request();
  expect_reply(deadline());
  std::uint32_t v = 0;
  read_exact(&v, sizeof(v), deadline());
  return v;
}

void StoreClient::queue_push(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::queue_push).bytes(key).bytes(value);
  send_request();
  // No reply of its own: a refused authentication must not pass for a write done.
  if (!auth_expect_.empty()) finish_auth();
}

std::optional<std::string> StoreClient::queue_pop(std::string_view key) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::queue_pop).bytes(key);
  send_request();
  expect_reply(deadline());
  if (read_i64() <= 0) return std::nullopt;
  return read_bytes();
}

std::int64_t StoreClient::queue_len(std::string_view key) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::queue_len).bytes(key);
  send_request();
  expect_reply(deadline());
  return read_i64();
}

std::vector<std::string> StoreClient::list_keys() {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::list_keys);
  send_request();
  expect_reply(deadline());
  std::int64_t n = read_i64();
  if (n < 0) broken("negative key count in LIST_KEYS reply");
  std::vector<std::string> out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(read_bytes());
  return out;
}

void StoreClient::barrier(std::string_view key, std::int64_t world_size,
                          std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::barrier).bytes(key).value(world_size);
  send_request();
  await_stop(timeout,
             [&] { return "barrier '" + std::string(key) + "' of " + std::to_string(world_size); });
}

std::uint64_t StoreClient::lease_grant(std::chrono::milliseconds ttl, bool bind_to_connection) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_)
      .op(Dialect::v2, Op::lease_grant)
      .value<std::int64_t>(ttl.count())
      .u8(bind_to_connection ? 1 : 0);
  send_request();
  expect_reply(deadline());
  return static_cast<std::uint64_t>(read_i64());
}

// LEASE_KEEPALIVE and LEASE_REVOKE: u64 lease -> u8 0 ok / 1 unknown.
bool StoreClient::lease_op(proto::Op op, std::uint64_t lease) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, op).value(lease);
  send_request();
  expect_reply(deadline());
  return read_u8() == 0;
}

bool StoreClient::lease_keepalive(std::uint64_t lease) {
  return lease_op(Op::lease_keepalive, lease);
}

bool StoreClient::lease_revoke(std::uint64_t lease) { return lease_op(Op::lease_revoke, lease); }

void StoreClient::set_with_lease(std::string_view key, std::string_view value,
                                 std::uint64_t lease) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::set_with_lease).bytes(key).bytes(value).value(lease);
  send_request();
  expect_reply(deadline());
  if (read_u8() != 0) {
    DDP_THROW(ProtocolError,
              "set_with_lease: lease " + std::to_string(lease) + " is unknown or expired");
  }
}

bool StoreClient::lease_will(std::uint64_t lease, std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  Writer(buf_).op(Dialect::v2, Op::lease_will).value(lease).bytes(key).bytes(value);
  send_request();
  expect_reply(deadline());
  return read_u8() == 0;
}

}  // namespace ddp::rdzv
