// The store server's hardening with real sockets (issue 14): back-pressure on a client that
// never reads, per-connection and global memory budgets, the deadline on a started request,
// leases counted in the store cap, a second VALIDATE, BARRIER n <= 0, close-on-exec sockets.
#include <fcntl.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/hex.hpp"
#include "support/raw_socket.hpp"
#include "support/store_fixture.hpp"
#include "support/skip.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/kv_table.hpp"
#include "ddp/rdzv/server.hpp"

using namespace ddp::rdzv;
using namespace std::chrono_literals;
using ddp::test::RawSocket;
using ddp::test::unhex;

namespace {

using Server = ddp::test::ServerFixture;
using ddp::test::eventually;

const std::string kValidate = unhex("00 cef7853c");

std::string u64(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string str(const std::string& s) { return u64(s.size()) + s; }

// Small limits so that every budget is reached with little memory.
ServerOptions small() {
  ServerOptions o;
  o.threads = 2;
  o.limits.max_value_bytes = 64 * 1024;
  o.max_connection_bytes = 2 * 1024 * 1024;  // 4 x (256 KiB + 64 KiB) + 64 KiB fits
  o.max_client_bytes = 8 * 1024 * 1024;
  o.max_pending_reply_bytes = 256 * 1024;
  return o;
}

// The most a TCP socket's buffer grows to (the third field of /proc/sys/net/ipv4/tcp_wmem or
// tcp_rmem: autotuning's ceiling); 0 when it cannot be read.
std::size_t tcp_buffer_ceiling(const std::string& name) {
  std::ifstream in("/proc/sys/net/ipv4/" + name);
  std::size_t low = 0, initial = 0, ceiling = 0;
  if (!(in >> low >> initial >> ceiling)) return 0;
  return ceiling;
}

}  // namespace

TEST_CASE("a client that never reads is held at the reply cap, it resumes when it reads",
          "[integration][budget]") {
  const ServerOptions o = small();
  Server s(o);
  auto writer = s.client();
  const std::string value(60 * 1024, 'v');
  const std::size_t reply = 8 + value.size();  // a GET's reply: the length, then the value
  writer->set("big", value);
  REQUIRE(writer->check({"big"}));  // SET has no reply: a round trip makes sure it is stored
  // Enough GETs that their replies are more than the kernel can buffer between the server and
  // a client that never reads (the server's send buffer and the client's receive buffer, each
  // at its ceiling) plus the connection's whole budget: the server must queue replies up to
  // its cap, and one that did not stop there would go over the budget.
  const std::size_t kernel = tcp_buffer_ceiling("tcp_wmem") + tcp_buffer_ceiling("tcp_rmem");
  REQUIRE(kernel > 0);
  // Bounded: where the kernel may buffer more than 256 MiB, the replies needed would be more.
  if (kernel > (std::size_t{256} << 20)) {
    DDP_SKIP("TCP buffers may grow to " << kernel << " bytes here: over the test's 256 MiB bound");
  }
  REQUIRE(o.max_connection_bytes > o.max_pending_reply_bytes + reply);
  const std::size_t n = (kernel + o.max_connection_bytes) / reply + 2;
  INFO(n << " GETs of " << reply << " bytes; kernel buffers at most " << kernel
         << " bytes, reply cap " << o.max_pending_reply_bytes << ", connection budget "
         << o.max_connection_bytes);
  REQUIRE(n * reply > kernel + o.max_connection_bytes);
  const auto gets_served = [&](const ServerStats& st) {
    return st.requests_by_op[static_cast<std::size_t>(OpKind::get)];
  };
  const std::uint64_t sent_before = s.server.stats().bytes_sent;  // the writer's, so far
  RawSocket hog(s.server.port());
  std::string gets;
  for (std::size_t i = 0; i < n; ++i) gets += unhex("03") + str("big");
  REQUIRE(hog.send(kValidate + gets));
  // The hog's replies made but not yet written (the writer is idle meanwhile): first they reach
  // the cap, as they must.
  const auto queued = [&](const ServerStats& st) -> std::uint64_t {
    const std::uint64_t made = gets_served(st) * reply, sent = st.bytes_sent - sent_before;
    return made > sent ? made - sent : 0;
  };
  REQUIRE(eventually([&] { return queued(s.server.stats()) >= o.max_pending_reply_bytes; }));
  // Then the server holds them there: less than the cap plus the one reply that crossed it,
  // the rest of the GETs not served, and no connection closed for it.
  const ServerStats st = s.server.stats();
  CHECK(queued(st) < o.max_pending_reply_bytes + reply);
  CHECK(gets_served(st) < n);
  CHECK(st.client_bytes <= o.max_connection_bytes);
  CHECK(st.over_budget == 0);
  CHECK(writer->add("other", 1) == 1);  // the others are served meanwhile
  // Reading, the hog gets all n replies, in order, intact.
  std::string all = hog.recv(n * reply, 30s);
  REQUIRE(all.size() == n * reply);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = i * reply;
    CHECK(all.compare(at, 8, u64(value.size())) == 0);
    CHECK(all.compare(at + 8, value.size(), value) == 0);
  }
  CHECK(gets_served(s.server.stats()) == n);
  CHECK(s.server.stats().over_budget == 0);
}

TEST_CASE("an unfinished request over the connection budget closes only that connection",
          "[integration][budget]") {
  auto o = small();
  o.limits.max_request_bytes = 64 * 1024 * 1024;  // the budget, not the decoder, stops it
  Server s(o);
  auto good = s.client();
  good->set("k", "v");
  RawSocket bad(s.server.port());
  // MULTI_SET of 64 values of 60 KiB: 3.8 MiB, never finished within a 2 MiB budget.
  std::string frame = kValidate + unhex("0b") + u64(64);
  for (int i = 0; i < 64; ++i) frame += str("k" + std::to_string(i)) + str(std::string(60000, 'x'));
  bad.send(frame.substr(0, 3 * 1024 * 1024));
  CHECK(bad.closed_by_peer());
  CHECK(s.server.stats().over_budget == 1);
  CHECK(good->get("k") == "v");
  CHECK(eventually([&] { return s.server.stats().client_bytes < 256 * 1024; }));
}

TEST_CASE("a HELLO client over a budget is told why", "[integration][budget]") {
  Server s(small());
  auto c = s.client();
  c->set("v", std::string(60 * 1024, 'x'));
  // One MULTI_GET naming the same 60 KiB value 64 times: a 3.8 MiB reply, refused before it
  // is built.
  try {
    (void)c->multi_get(std::vector<std::string>(64, "v"));
    FAIL("the reply cannot fit the budget");
  } catch (const ddp::Error& e) {
    CHECK(std::string(e.what()).find("max-connection-bytes") != std::string::npos);
  }
  // A WAIT on more key bytes than the budget holds.
  auto w = s.client();
  std::vector<std::string> keys;
  for (int i = 0; i < 160; ++i)
    keys.push_back(std::string(8000, static_cast<char>('a' + i % 26)) + std::to_string(i));
  try {
    w->wait(keys, 2s);
    FAIL("the wait cannot fit the budget");
  } catch (const ddp::Error& e) {
    CHECK(std::string(e.what()).find("WAIT on 160 keys") != std::string::npos);
  }
  CHECK(s.server.stats().over_budget == 2);
  CHECK(s.client()->num_keys() == 1);
}

TEST_CASE("the global budget holds across connections, small clients are never refused",
          "[integration][budget]") {
  auto o = small();
  o.max_client_bytes = o.max_connection_bytes;  // one connection's worth
  Server s(o);
  std::vector<std::unique_ptr<RawSocket>> partial;
  // 16 connections each hold 600 KB of an unfinished MULTI_SET: 9.6 MB in all.
  std::string frame = kValidate + unhex("0b") + u64(12);
  for (int i = 0; i < 12; ++i) frame += str("k" + std::to_string(i)) + str(std::string(60000, 'x'));
  for (int i = 0; i < 16; ++i) {
    partial.push_back(std::make_unique<RawSocket>(s.server.port()));
    partial.back()->send(frame.substr(0, 600000));
  }
  CHECK(eventually([&] { return s.server.stats().over_budget >= 1; }));
  // Each connection's first 64 KiB are its own; the rest of all of them is the budget.
  CHECK(s.server.stats().client_bytes <= o.max_client_bytes + 17 * 64 * 1024);
  auto c = s.client();  // a small client while the budget is spent: served
  CHECK(c->add("n", 1) == 1);
  c->set("v", std::string(30000, 'v'));
  CHECK(c->get("v").size() == 30000);
  partial.clear();
  CHECK(eventually([&] { return s.server.stats().client_bytes < 64 * 1024; }));
}

TEST_CASE("a started request must finish within the frame deadline", "[integration][budget]") {
  auto o = small();
  o.frame_timeout = 1s;
  Server s(o);
  RawSocket slow(s.server.port());
  slow.send(kValidate + unhex("01") + str("key"));  // SET: key sent, value never
  CHECK(slow.closed_by_peer(10s));
  CHECK(s.server.stats().frame_timeouts == 1);
  // Idle between requests is not a started request: a quiet client stays.
  RawSocket quiet(s.server.port());
  quiet.send(kValidate);
  CHECK_FALSE(quiet.closed_by_peer(1500ms));
  quiet.send(unhex("04") + str("n") + u64(5));  // ADD 5
  CHECK(quiet.recv(8) == u64(5));
  // Whole requests one byte at a time, each within the deadline, are served.
  RawSocket trickle(s.server.port());
  std::string add = kValidate + unhex("04") + str("n") + u64(1);
  for (char ch : add) {
    trickle.send(std::string(1, ch));
    std::this_thread::sleep_for(1ms);
  }
  CHECK(trickle.recv(8) == u64(6));
  CHECK(s.server.stats().frame_timeouts == 1);
}

TEST_CASE("leases are counted in the store cap", "[integration][budget]") {
  ServerOptions o;
  o.threads = 1;
  o.max_store_bytes = 64 * 1024;
  Server s(o);
  auto c = s.client();
  int granted = 0;
  try {
    for (; granted < 100000; ++granted) (void)c->lease_grant(60s, false);
    FAIL("unbounded leases");
  } catch (const ddp::Error& e) {
    CHECK(std::string(e.what()).find("the store is full") != std::string::npos);
  }
  CHECK(granted == static_cast<int>(o.max_store_bytes / KvTable::kLeaseOverhead));
}

TEST_CASE("a second VALIDATE and a BARRIER of no one are refused", "[integration][budget]") {
  Server s(small());
  RawSocket twice(s.server.port());
  twice.send(kValidate + kValidate);
  CHECK(twice.closed_by_peer());
  auto c = s.client();
  try {
    c->barrier("b", 0, 2s);
    FAIL("BARRIER with world size 0 must be refused");
  } catch (const ddp::ProtocolError& e) {
    CHECK(std::string(e.what()).find("BARRIER with world size 0 (must be > 0)") !=
          std::string::npos);
  }
  CHECK(s.server.stats().protocol_errors == 2);
}

TEST_CASE("the listener and every accepted connection are close-on-exec", "[integration]") {
#if defined(__SANITIZE_THREAD__)
  // Scanning every fd of the process while the server's threads own some is what this test
  // does; TSan reports fstat against a close on another thread. The other builds check it.
  DDP_SKIP("under ThreadSanitizer: the fd scan races with the server's threads by design");
#endif
  Server s(small());
  auto a = s.client();
  auto b = s.client();
  CHECK(a->add("x", 1) == 1);
  CHECK(b->add("x", 1) == 2);
  REQUIRE(eventually([&] { return s.server.stats().connections_open == 2; }));
  int sockets = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::stoi(e.path().filename().string());
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    ++sockets;
    INFO("fd " << fd);
    CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  }
  CHECK(sockets >= 5);  // the listener, two client ends, two server ends
}
