// loadgen_wire: the socket and wire helpers of store_loadgen (blocking setup, non-blocking I/O).
#include "loadgen_wire.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <thread>

#include "ddp/proto/writer.hpp"

namespace loadgen {

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

Endpoint resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); rc != 0 || !res) {
    throw std::runtime_error("cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  Endpoint ep;
  std::memcpy(&ep.addr, res->ai_addr, res->ai_addrlen);
  ep.len = res->ai_addrlen;
  ep.family = res->ai_family;
  ::freeaddrinfo(res);
  return ep;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Blocking connect, retried for up to 10 s while the server's backlog refuses us.
int connect_blocking(const Endpoint& ep) {
  std::uint64_t deadline = now_ns() + 10'000 * kMs;
  for (;;) {
    int fd = ::socket(ep.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) == 0) {
      set_nodelay(fd);
      return fd;
    }
    int err = errno;
    ::close(fd);
    if (now_ns() > deadline || (err != ECONNREFUSED && err != ECONNRESET && err != EAGAIN &&
                                err != ETIMEDOUT && err != EINTR && err != EADDRNOTAVAIL)) {
      throw std::runtime_error(std::string("connect: ") + std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void recv_exact(int fd, char* buf, std::size_t len) {
  while (len > 0) {
    ssize_t n = ::recv(fd, buf, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("connection closed during setup");
    buf += n;
    len -= static_cast<std::size_t>(n);
  }
}

void put_validate(std::string& out) {
  proto::Writer(out).op(kV2, proto::Op::validate).value<std::uint32_t>(proto::kValidateMagic);
}

Flush flush(int fd, const std::string& out, std::size_t& off) {
  while (off < out.size()) {
    ssize_t n = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Flush::blocked;
    } else {
      return Flush::error;
    }
  }
  return Flush::done;
}

// Reads everything available into `in`; false on EOF or a hard error.
bool drain(int fd, std::string& in) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      in.append(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    } else {
      return false;
    }
  }
}

}  // namespace loadgen
