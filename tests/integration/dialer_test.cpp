// The one dialer (StoreClient's connect): a cancel fd ends the attempts at once, and a server
// that closes the connection at HELLO is named as not a ddprun store, by type.
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"

using namespace ddp::rdzv;
using namespace std::chrono_literals;

namespace {
// A listening socket on 127.0.0.1:0; accept_and_close() takes one connection and closes it.
struct Listener {
  int fd = -1;
  std::uint16_t port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  void accept_and_close() const {
    int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    char buf[64];
    (void)!::recv(c, buf, sizeof(buf), 0);  // VALIDATE + HELLO, then gone
    ::close(c);
  }
};

// A port nobody listens on: bound and closed.
std::uint16_t dead_port() {
  Listener l;
  return l.port;
}
}  // namespace

TEST_CASE("a cancel fd ends the dialer's retries at once", "[integration][dialer]") {
  const std::uint16_t port = dead_port();
  int cancel = ::eventfd(0, EFD_CLOEXEC);
  std::thread later([cancel] {
    std::this_thread::sleep_for(100ms);
    std::uint64_t one = 1;
    (void)!::write(cancel, &one, sizeof(one));
  });
  ClientOptions o;
  o.connect_timeout = 600s;  // without the cancel fd this test would hang for 10 minutes
  o.cancel_fd = cancel;
  try {
    StoreClient c(Endpoint{"127.0.0.1", port}, o);
    FAIL("connected to a closed port");
  } catch (const ddp::IoError& e) {
    CHECK_THAT(e.what(), Catch::Contains("connecting interrupted"));
  }
  later.join();
  ::close(cancel);
}

TEST_CASE("a server that closes at HELLO is not a ddprun store (ProtocolError)",
          "[integration][dialer]") {
  Listener l;
  std::thread server([&] { l.accept_and_close(); });
  ClientOptions o;
  o.connect_timeout = 5s;
  o.timeout = 5s;
  CHECK_THROWS_AS(StoreClient(Endpoint{"127.0.0.1", l.port}, o), ddp::ProtocolError);
  server.join();
}

TEST_CASE("an unreachable store is an IoError after connect_timeout", "[integration][dialer]") {
  ClientOptions o;
  o.connect_timeout = 200ms;
  CHECK_THROWS_AS(StoreClient(Endpoint{"127.0.0.1", dead_port()}, o), ddp::IoError);
}
