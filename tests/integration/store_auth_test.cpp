// Stores that only the job's processes may use (docs/security.md), on a real server and real
// sockets: with a secret, a good client works while clients with a wrong secret, with none, or
// replaying a recorded AUTH are refused and counted; trusted networks admit torch clients as
// they are; a closed store refuses other addresses at connect; a client refuses a store that
// cannot prove it holds the secret. Peers come from other loopback addresses (127.0.0.2...):
// all of 127/8 is this host's. A by-user store refuses another user's socket on loopback.
// Bounded: a few connections, 5 s per reply.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "support/hex.hpp"
#include "support/raw_socket.hpp"
#include "support/skip.hpp"
#include "support/store_fixture.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/writer.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/peer_uid.hpp"
#include "ddp/rdzv/server.hpp"

using namespace ddp::rdzv;
using namespace ddp::proto;
using namespace std::chrono_literals;
using ddp::test::eventually;
using ddp::test::RawSocket;
using ddp::test::unhex;

namespace {

const std::string kSecret = "job-secret-0123456789abcdef";

ServerOptions with_secret(std::vector<Cidr> trusted = {}) {
  ServerOptions o;
  o.secret = kSecret;
  o.trusted = std::move(trusted);
  return o;
}

ClientOptions secret(const std::string& s) {
  ClientOptions o;
  o.secret = s;
  return o;
}

// VALIDATE + HELLO v2 on a raw socket; returns the store's challenge (empty: none).
std::string hello(RawSocket& s) {
  std::string req;
  Writer(req).u8(0).value<std::uint32_t>(kValidateMagic).u8(0x80).value<std::uint32_t>(2);
  REQUIRE(s.send(req));
  auto head = s.recv(1 + 4 + 8);
  REQUIRE(head.size() == 13);
  std::uint64_t n = 0;
  std::memcpy(&n, head.data() + 5, 8);
  return s.recv(n);
}

std::string auth_request(const std::string& cn, const std::string& proof) {
  std::string req;
  Writer(req).u8(0x86).bytes(cn).bytes(proof);
  return req;
}

// A torch client's SET then GET of /k on a raw socket (no HELLO: plain replies).
bool torch_set_get(RawSocket& s) {
  std::string req;
  Writer(req).u8(0).value<std::uint32_t>(kValidateMagic);
  Writer(req).u8(1).bytes("/k").bytes("v");
  Writer(req).u8(3).bytes("/k");
  if (!s.send(req)) return false;
  return s.recv(9) == unhex("0100000000000000 76");
}

}  // namespace

TEST_CASE("with a secret a good client works and the others are refused and counted",
          "[integration][auth]") {
  ddp::test::ServerFixture f(with_secret());
  auto good = f.client(secret(kSecret));
  good->set("/a", "1");
  CHECK(good->get("/a") == "1");

  CHECK_THROWS_WITH(f.client()->get("/a"), Catch::Contains("authentication required"));
  CHECK_THROWS_WITH(f.client(secret("wrong-secret-0123456789"))->get("/a"),
                    Catch::Contains("refused authentication"));
  // A write without a reply must not pass for done: the refusal surfaces at once.
  CHECK_THROWS_WITH(f.client(secret("wrong-secret-0123456789"))->set("/b", "x"),
                    Catch::Contains("refused authentication"));
  ClientOptions plain;  // a torch client: no HELLO, so the store just closes
  plain.extensions = false;
  CHECK_THROWS_AS(f.client(plain)->get("/a"), ddp::IoError);

  CHECK(good->get("/a") == "1");  // unaffected
  CHECK_FALSE(good->check({"/b"}));
  const auto st = f.server.stats();
  CHECK(st.auth_ok == 1);
  CHECK(st.auth_failures == 2);
  CHECK(st.refused_unauthenticated == 2);
}

TEST_CASE("a recorded AUTH replayed on a new connection is refused", "[integration][auth]") {
  ddp::test::ServerFixture f(with_secret());
  // What an eavesdropper records: a real client's nonce and proof for challenge 1.
  RawSocket first(f.server.port());
  const std::string challenge = hello(first);
  REQUIRE(challenge.size() == auth::kNonceBytes);
  const std::string cn = auth::nonce();
  const std::string proof = auth::client_proof(kSecret, cn, challenge);
  REQUIRE(first.send(auth_request(cn, proof)));
  CHECK(first.recv(1 + 8 + 32).substr(0, 9) == unhex("00 2000000000000000"));

  RawSocket replay(f.server.port());
  const std::string other = hello(replay);
  CHECK(other != challenge);
  std::string req = auth_request(cn, proof);
  Writer(req).u8(3).bytes("/a");
  REQUIRE(replay.send(req));
  CHECK(static_cast<std::uint8_t>(replay.recv(1)[0]) == kReplyError);
  CHECK(replay.closed_by_peer());
  CHECK(f.server.stats().auth_failures == 1);
  // The same AUTH twice on its own connection is refused too: a challenge is answered once.
  REQUIRE(first.send(auth_request(cn, proof)));
  CHECK(static_cast<std::uint8_t>(first.recv(1)[0]) == kReplyError);
}

TEST_CASE("trusted networks admit torch clients without a secret", "[integration][auth]") {
  ddp::test::ServerFixture f(with_secret({parse_cidr("127.0.0.2/32")}));
  RawSocket trusted(f.server.port(), "127.0.0.2");
  CHECK(torch_set_get(trusted));
  RawSocket outsider(f.server.port(), "127.0.0.3");
  CHECK_FALSE(torch_set_get(outsider));
  CHECK(outsider.closed_by_peer());
  CHECK(f.server.stats().refused_unauthenticated == 1);
}

TEST_CASE("a closed store refuses other addresses at connect, then admits a new round's",
          "[integration][auth]") {
  ServerOptions o;
  o.closed = true;
  o.trusted = {parse_cidr("127.0.0.2/32")};
  ddp::test::ServerFixture f(o);
  RawSocket member(f.server.port(), "127.0.0.2");
  CHECK(torch_set_get(member));
  {
    RawSocket outsider(f.server.port(), "127.0.0.4");
    CHECK(outsider.closed_by_peer());
  }
  CHECK(eventually([&] { return f.server.stats().refused_address == 1; }));
  f.server.set_trusted({parse_cidr("127.0.0.4/32")});
  RawSocket next(f.server.port(), "127.0.0.4");
  CHECK(torch_set_get(next));
  CHECK(f.server.stats().connections_total == 2);  // the refused one never got a session
}

TEST_CASE("a client with a secret uses a store without one", "[integration][auth]") {
  ddp::test::ServerFixture f(ServerOptions{});
  auto c = f.client(secret(kSecret));
  c->set("/x", "y");
  CHECK(c->get("/x") == "y");
  CHECK(f.server.stats().auth_ok == 0);
}

TEST_CASE("a client refuses a store that cannot prove it holds the secret", "[integration][auth]") {
  // A fake store: challenges, then accepts any proof and answers with a made-up one.
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(lfd, 1) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread fake([lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    char buf[256];
    std::string reply;
    Writer(reply).u8(0).value<std::uint32_t>(2).bytes(std::string(32, 'n'));
    if (::recv(fd, buf, 10, MSG_WAITALL) == 10) ::send(fd, reply.data(), reply.size(), 0);
    reply.clear();
    Writer(reply).u8(0).bytes(std::string(32, 'p'));
    if (::recv(fd, buf, 1 + 8 + 32 + 8 + 32, MSG_WAITALL) > 0) {
      ::send(fd, reply.data(), reply.size(), 0);
    }
    ::recv(fd, buf, sizeof(buf), 0);
    ::close(fd);
  });
  ClientOptions o = secret(kSecret);
  o.timeout = 5s;
  o.connect_timeout = 5s;
  {
    StoreClient c("127.0.0.1", ntohs(a.sin_port), o);
    CHECK_THROWS_WITH(c.get("/a"), Catch::Contains("does not hold the job's secret"));
  }
  fake.join();
  ::close(lfd);
}

TEST_CASE("a by-user store asks the kernel whose socket a loopback peer is",
          "[integration][auth]") {
  ServerOptions o;
  o.closed = true;
  o.trusted = loopback_networks();
  o.loopback_uids = std::vector<std::uint32_t>{};  // this process's user and root
  ddp::test::ServerFixture f(o);
  {
    RawSocket mine(f.server.port());
    CHECK(torch_set_get(mine));
    CHECK(local_peer_uid(mine.fd()) == ::geteuid());  // the server's socket: this process's
  }
  CHECK(f.server.stats().refused_user == 0);
}

TEST_CASE("a by-user store closes another user's loopback socket at once", "[integration][auth]") {
  // Another user's socket: a child that drops to nobody before it connects.
  if (::geteuid() != 0) {
    DDP_SKIP("not root: cannot become another user here (tests/hostile/test_store_users.py does)");
  }
  ServerOptions o;
  o.closed = true;
  o.trusted = loopback_networks();
  o.loopback_uids = std::vector<std::uint32_t>{};
  ddp::test::ServerFixture f(o);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) _exit(3);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(f.server.port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) _exit(4);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char ping[] = {0x09};  // any request: the server must close before answering
    (void)::write(fd, ping, 1);
    char buf[16];
    const ssize_t n = ::read(fd, buf, sizeof buf);  // EOF or a reset: refused; EAGAIN: not
    _exit(n == 0 || (n < 0 && errno == ECONNRESET) ? 0 : 5);
  }
  int status = -1;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(eventually([&] { return f.server.stats().refused_user == 1; }));
}
