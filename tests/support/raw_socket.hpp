// A bare blocking TCP socket for tests that must send exactly the bytes they choose:
// garbage, split frames, torch 1.13 opcodes. Every read is bounded by a timeout.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace ddp::test {

class RawSocket {
 public:
  // `source`: the loopback address to connect from (127.0.0.1 by default; all of 127/8 is
  // this host's), for tests of who a store admits.
  explicit RawSocket(std::uint16_t port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
        throw std::runtime_error("bind to the source address failed");
      }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      throw std::runtime_error("connect failed");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawSocket(const RawSocket&) = delete;
  int fd() const { return fd_; }
  RawSocket& operator=(const RawSocket&) = delete;

  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  // Reads up to `n` bytes, waiting at most `timeout` in all; fewer on timeout or EOF.
  std::string recv(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      auto r = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (r <= 0) {
        eof_ = true;
        break;
      }
      out.append(buf, static_cast<std::size_t>(r));
    }
    return out;
  }

  // True once the server has closed the connection (read returns 0 or an error).
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    recv(1 << 20, timeout);
    return eof_;
  }

 private:
  int fd_ = -1;
  bool eof_ = false;
};

}  // namespace ddp::test
