// The real server on 127.0.0.1:0 with real clients: concurrency, deferred waits across
// connections, timeouts followed by more traffic, segmentation, hostile input, limits,
// leases and shutdown. No sleeps: every wait is a bounded poll for a condition.
#include <catch2/catch.hpp>
#include <thread>

#include "support/hex.hpp"
#include "support/raw_socket.hpp"
#include "support/store_fixture.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"

using namespace ddp::rdzv;
using namespace std::chrono_literals;
using ddp::test::RawSocket;
using ddp::test::unhex;

namespace {

// Three event loops unless a test says otherwise: connections land on different loops, so
// wake-ups, barriers and cancels cross threads in every test (the TSan run relies on it).
ServerOptions multi_loop(ServerOptions o) {
  if (o.threads == 0) o.threads = 3;
  return o;
}

struct Fixture : ddp::test::ServerFixture {
  explicit Fixture(ServerOptions o = {}) : ServerFixture(multi_loop(std::move(o))) {}
};

using ddp::test::eventually;

const std::string kValidate = unhex("00 cef7853c");

}  // namespace

TEST_CASE("16 threads x 1000 adds count exactly", "[integration]") {
  Fixture f;
  auto c0 = f.client();
  c0->add("counter", 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      auto c = f.client();
      for (int i = 0; i < 1000; ++i) c->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(c0->add("counter", 0) == 16 * 1000 + 1);
  CHECK(c0->get("counter") == "16001");
}

TEST_CASE("all operations round-trip through the C++ client", "[integration]") {
  Fixture f;
  auto c = f.client();
  c->set("a", std::string("\0bin\xff", 5));
  CHECK(c->get("a") == std::string("\0bin\xff", 5));
  CHECK(c->compare_set("a", "wrong", "x") == std::string("\0bin\xff", 5));
  CHECK(c->compare_set("missing", "", "new") == "new");
  CHECK(c->check({"a", "missing"}));
  CHECK_FALSE(c->check({"a", "nope"}));
  c->append("log", "one,");
  c->append("log", "two");
  CHECK(c->get("log") == "one,two");
  c->multi_set({"m1", "m2"}, {"v1", "v2"});
  CHECK(c->multi_get({"m2", "m1"}) == std::vector<std::string>{"v2", "v1"});
  CHECK(c->num_keys() == 5);
  auto keys = c->list_keys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"a", "log", "m1", "m2", "missing"});
  CHECK(c->delete_key("m1"));
  CHECK_FALSE(c->delete_key("m1"));
  CHECK(c->ping(99) == 99);
  c->queue_push("q", "x");
  CHECK(c->queue_len("q") == 1);
  CHECK(c->queue_pop("q") == std::optional<std::string>("x"));
  CHECK(c->queue_pop("q") == std::nullopt);
  std::string big(1 << 20, 'b');
  c->set("big", big);
  CHECK(c->get("big") == big);
}

TEST_CASE("a wait is released by another client's set", "[integration]") {
  Fixture f;
  auto waiter = f.client();
  auto setter = f.client();
  std::thread t([&] { waiter->wait({"go", "go2"}, 10s); });
  setter->set("go", "1");
  setter->add("go2", 1);
  t.join();
  CHECK(waiter->get("go") == "1");
}

TEST_CASE("a timed-out wait leaves the connection usable", "[integration]") {
  Fixture f;
  auto c = f.client();
  auto other = f.client();
  CHECK_THROWS_AS(c->wait({"late"}, 50ms), ddp::TimeoutError);
  other->set("late", "now");           // must not leave a stray STOP_WAITING on c's connection
  CHECK(other->get("late") == "now");  // SET has no reply: make sure it was served
  CHECK(c->add("n", 2) == 2);
  CHECK(c->num_keys() == 2);
  CHECK(c->get("late") == "now");
  try {
    c->wait({"k1", "k2"}, 20ms);
    FAIL("wait should time out");
  } catch (const ddp::TimeoutError& e) {
    CHECK(std::string(e.what()).find("k1, k2") != std::string::npos);
  }
}

TEST_CASE("barrier across three clients", "[integration]") {
  Fixture f;
  std::vector<std::thread> ts;
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&] {
      auto c = f.client();
      c->barrier("bar", 3, 10s);
      ++done;
    });
  }
  for (auto& t : ts) t.join();
  CHECK(done == 3);
  CHECK_THROWS_AS(f.client()->barrier("bar2", 2, 30ms), ddp::TimeoutError);
}

TEST_CASE("requests split into single bytes are served", "[integration]") {
  Fixture f;
  RawSocket s(f.server.port());
  auto bytes = kValidate + unhex("0402000000000000002f6e0500000000000000");
  for (char b : bytes) REQUIRE(s.send(std::string(1, b)));
  CHECK(ddp::test::hex(s.recv(8)) == "0500000000000000");
}

TEST_CASE("garbage from one client closes only that client", "[integration]") {
  Fixture f;
  auto good = f.client();
  good->set("k", "v");
  {
    RawSocket bad(f.server.port());
    bad.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(bad.closed_by_peer());
  }
  {
    RawSocket bad(f.server.port());  // a valid start, then an absurd key length
    bad.send(kValidate + unhex("01 ffffffffffffff7f"));
    CHECK(bad.closed_by_peer());
  }
  {
    RawSocket truncated(f.server.port());  // half a request, then gone
    truncated.send(kValidate + unhex("0102000000"));
  }
  CHECK(good->get("k") == "v");
  CHECK(good->add("c", 1) == 1);
  CHECK(eventually([&] { return f.server.stats().protocol_errors == 2; }));
}

TEST_CASE("limits answer a HELLO client with the reason before closing", "[integration]") {
  ServerOptions o;
  o.limits.max_key_bytes = 32;
  Fixture f(o);
  auto c = f.client();
  try {
    c->set(std::string(33, 'k'), "v");
    c->num_keys();  // the refusal arrives in place of this reply
    FAIL("an oversized key must be refused");
  } catch (const ddp::ProtocolError& e) {
    CHECK(std::string(e.what()).find("key of 33 bytes exceeds the limit of 32") !=
          std::string::npos);
  }
  CHECK(f.client()->num_keys() == 0);  // the store itself is fine
}

TEST_CASE("connections over the limit are refused, the others keep working", "[integration]") {
  ServerOptions o;
  o.max_connections = 2;
  Fixture f(o);
  auto a = f.client();
  auto b = f.client();
  RawSocket third(f.server.port());
  CHECK(third.closed_by_peer());
  CHECK(f.server.stats().connections_refused == 1);
  CHECK(a->add("x", 1) == 1);
  CHECK(b->add("x", 1) == 2);
}

TEST_CASE("torch 1.13 dialect: opcodes, and a timed-out wait does not desync", "[integration]") {
  Fixture f;
  RawSocket s(f.server.port());
  // 1.13 SET /k v = opcode 00, no VALIDATE
  s.send(unhex("00 0200000000000000 2f6b 0100000000000000 76"));
  s.send(unhex("05 0100000000000000 0200000000000000 2f6b"));  // WAIT /k: ready
  CHECK(ddp::test::hex(s.recv(1)) == "00");
  s.send(unhex("02 0200000000000000 2f6b"));  // GET
  CHECK(ddp::test::hex(s.recv(9)) == "010000000000000076");
  // WAIT on a missing key; the 1.13 client times out and sends its next request instead
  s.send(unhex("05 0100000000000000 0500000000000000 2f6c617465"));
  CHECK(s.recv(1, 100ms).empty());
  s.send(unhex("06"));  // GETNUMKEYS
  CHECK(ddp::test::hex(s.recv(8)) == "0100000000000000");
  auto setter = f.client();
  setter->set("/late", "x");  // the abandoned wait must not answer now
  CHECK(setter->get("/late") == "x");
  s.send(unhex("03 0200000000000000 2f6e 0500000000000000"));  // ADD /n 5
  CHECK(ddp::test::hex(s.recv(8)) == "0500000000000000");
}

TEST_CASE("CANCEL_WAIT after the key arrived drains STOP_WAITING then WAIT_CANCELED",
          "[integration]") {
  Fixture f;
  RawSocket s(f.server.port());
  s.send(kValidate + unhex("06 0100000000000000 0200000000000000 2f77"));
  CHECK(s.recv(1, 50ms).empty());
  f.client()->set("/w", "1");
  CHECK(ddp::test::hex(s.recv(1)) == "00");
  s.send(unhex("0c"));  // a cancel that crossed the reply still gets WAIT_CANCELED
  CHECK(ddp::test::hex(s.recv(1)) == "01");
}

TEST_CASE("leases: bound to a connection, or to a ttl", "[integration]") {
  Fixture f;
  auto watcher = f.client();
  {
    auto node = f.client();
    auto lease = node->lease_grant(0ms, true);
    node->set_with_lease("alive/node0", "1", lease);
    CHECK(watcher->check({"alive/node0"}));
  }
  CHECK(eventually([&] { return !watcher->check({"alive/node0"}); }));

  auto node = f.client();
  auto lease = node->lease_grant(1000ms, false);
  node->set_with_lease("alive/node1", "1", lease);
  CHECK(node->lease_keepalive(lease));
  CHECK(eventually([&] { return !watcher->check({"alive/node1"}); }, 20s));
  CHECK_FALSE(node->lease_keepalive(lease));
  CHECK_THROWS_AS(node->set_with_lease("k", "v", lease), ddp::Error);
}

TEST_CASE("a lease's will wakes a waiter when its holder dies or goes silent", "[integration]") {
  Fixture f;
  auto watcher = f.client();
  {
    auto node = f.client();
    auto lease = node->lease_grant(0ms, true);
    REQUIRE(node->lease_will(lease, "round/event", "lost node0"));
  }  // the connection closes: the will fires on the server, whose WAIT releases the watcher
  watcher->wait({"round/event"}, 10s);
  CHECK(watcher->get("round/event") == "lost node0");

  auto silent = f.client();
  auto lease = silent->lease_grant(300ms, false);
  REQUIRE(silent->lease_will(lease, "round2/event", "lost node1"));
  watcher->wait({"round2/event"}, 10s);  // nobody renews it: it expires on the server's clock
  CHECK(watcher->get("round2/event") == "lost node1");

  auto clean = f.client();
  auto l3 = clean->lease_grant(0ms, true);
  REQUIRE(clean->lease_will(l3, "round3/event", "lost"));
  REQUIRE(clean->lease_revoke(l3));
  clean.reset();
  // once the server has closed that session (watcher and silent remain), nothing fired
  REQUIRE(eventually([&] { return f.server.stats().connections_open == 2; }));
  CHECK_FALSE(watcher->check({"round3/event"}));  // a revoke is a clean exit
  CHECK_FALSE(watcher->lease_will(987654, "k", "v"));
}

TEST_CASE("stop() closes live connections and clients see an I/O error", "[integration]") {
  auto f = std::make_unique<Fixture>();
  auto c = f->client();
  c->set("k", "v");
  f->server.stop();
  CHECK_THROWS_AS(c->num_keys(), ddp::IoError);
  f.reset();
}

TEST_CASE("binding a port in use fails with the address in the message", "[integration]") {
  Fixture f;
  ServerOptions o;
  o.port = f.server.port();
  StoreServer second(o);
  try {
    second.start();
    FAIL("second bind should fail");
  } catch (const ddp::IoError& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(f.server.port())) !=
          std::string::npos);
  }
}

TEST_CASE("connecting to nothing gives up after connect_timeout", "[integration]") {
  std::uint16_t port;
  {
    Fixture f;
    port = f.server.port();
  }
  ClientOptions o;
  o.connect_timeout = 200ms;
  CHECK_THROWS_AS(StoreClient("127.0.0.1", port, o), ddp::IoError);
}

TEST_CASE("accepted sockets carry TCP_NODELAY and keep-alive from the listener", "[integration]") {
  Fixture f;
  auto c = f.client();
  c->set("k", "v");
  // The server runs in this process: find its side of the connection among our descriptors.
  int checked = 0;
  for (int fd = 3; fd < 1024; ++fd) {
    sockaddr_in local{}, peer{};
    socklen_t len = sizeof(local), plen = sizeof(peer);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    if (local.sin_family != AF_INET || ntohs(local.sin_port) != f.server.port()) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
    int nodelay = 0, keepalive = 0;
    socklen_t olen = sizeof(int);
    ::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &olen);
    ::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keepalive, &olen);
    CHECK(nodelay == 1);
    CHECK(keepalive == 1);
    ++checked;
  }
  CHECK(checked == 1);
}

TEST_CASE("a full store refuses the writer with the reason and keeps serving", "[integration]") {
  ServerOptions o;
  o.max_store_bytes = 4096;
  Fixture f(o);
  auto reader = f.client();
  reader->set("keep", "me");
  auto hog = f.client();
  try {
    for (int i = 0; i < 100; ++i) hog->set("hog/" + std::to_string(i), std::string(512, 'h'));
    hog->num_keys();
    FAIL("the store should have refused a write");
  } catch (const ddp::ProtocolError& e) {
    CHECK(std::string(e.what()).find("the store is full") != std::string::npos);
  }
  CHECK(reader->get("keep") == "me");
  CHECK(reader->delete_key("hog/0"));
  reader->set("small", "ok");  // room again after a delete
  CHECK(reader->get("small") == "ok");
}

TEST_CASE("one set wakes waiters spread over every loop, barriers span loops", "[integration]") {
  Fixture f;
  constexpr int kWaiters = 12;
  std::vector<std::thread> ts;
  std::atomic<int> woke{0}, through{0};
  for (int i = 0; i < kWaiters; ++i) {
    ts.emplace_back([&] {
      auto c = f.client();
      c->wait({"start"}, 20s);
      ++woke;
      c->barrier("finish", kWaiters, 20s);
      ++through;
    });
  }
  auto starter = f.client();
  starter->set("start", "go");
  for (auto& t : ts) t.join();
  CHECK(woke == kWaiters);
  CHECK(through == kWaiters);
  CHECK(starter->get("finish") == std::to_string(kWaiters));
}

TEST_CASE("waits cancelled while the key arrives from another loop stay in sync", "[integration]") {
  Fixture f;
  auto setter = f.client();
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      auto c = f.client();
      for (int i = 0; i < 50; ++i) {
        std::string key = "race/" + std::to_string(t) + "/" + std::to_string(i);
        try {
          c->wait({key}, 1ms);  // usually times out just as the setter writes the key
        } catch (const ddp::TimeoutError&) {
        }
        if (c->add("count/" + std::to_string(t), 1) == i + 1) ++ok;  // stream still in step
      }
    });
  }
  for (int i = 0; i < 50; ++i) {
    for (int t = 0; t < 4; ++t)
      setter->set("race/" + std::to_string(t) + "/" + std::to_string(i), "x");
  }
  for (auto& t : ts) t.join();
  CHECK(ok == 4 * 50);
}
