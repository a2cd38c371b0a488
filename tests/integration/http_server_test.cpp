// The status HTTP server with real sockets on 127.0.0.1: GET and HEAD answered, other methods,
// bodies, huge heads, garbage and slow clients refused or closed, the connection cap, keep-alive,
// a throwing handler answered 500 without detail.
#include <catch2/catch.hpp>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/raw_socket.hpp"
#include "support/store_fixture.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/status/http_server.hpp"

using namespace ddp::status;
using namespace std::chrono_literals;
using ddp::test::eventually;
using ddp::test::RawSocket;

namespace {

struct Reply {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
  std::string header(const std::string& name) const {
    const auto at = head.find("\r\n" + name + ": ");
    if (at == std::string::npos) return "";
    const auto from = at + name.size() + 4;
    return head.substr(from, head.find("\r\n", from) - from);
  }
};

// One response from `s` (status 0 when none came within the timeout).
Reply read_reply(RawSocket& s, bool head_request = false) {
  Reply r;
  while (r.head.size() < 64 * 1024 && r.head.find("\r\n\r\n") == std::string::npos) {
    const std::string c = s.recv(1, 5s);
    if (c.empty()) return r;
    r.head += c;
  }
  if (r.head.rfind("HTTP/1.", 0) != 0 || r.head.size() < 12) return r;
  r.status = std::stoi(r.head.substr(9, 3));
  const std::string length = r.header("Content-Length");
  if (!head_request && !length.empty()) r.body = s.recv(std::stoul(length), 5s);
  return r;
}

struct Fixture {
  std::atomic<int> calls{0};
  std::mutex mu;
  std::vector<HttpRequest> seen_;  // written on the server's thread
  HttpServer server;

  explicit Fixture(HttpOptions o = {})
      : server(std::move(o), [this](const HttpRequest& r) {
          ++calls;
          std::lock_guard<std::mutex> lock(mu);
          seen_.push_back(r);
          if (r.path == "/throw") throw std::runtime_error("secret detail");
          if (r.path == "/missing") return HttpResponse{404, "text/plain", "no\n"};
          return HttpResponse{200, "text/html; charset=utf-8", "hello " + r.path + "\n"};
        }) {
    server.start();
  }
  std::uint16_t port() const { return server.port(); }
  std::vector<HttpRequest> seen() {
    std::lock_guard<std::mutex> lock(mu);
    return seen_;
  }
};

std::string get(const std::string& target, const std::string& extra = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

}  // namespace

TEST_CASE("http: GET is answered with a body, the path and the query", "[integration][http]") {
  Fixture f;
  REQUIRE(f.port() != 0);
  RawSocket s(f.port());
  REQUIRE(s.send(get("/api/status?run=a%20b")));
  Reply r = read_reply(s);
  CHECK(r.status == 200);
  CHECK(r.body == "hello /api/status\n");
  CHECK(r.header("Content-Length") == std::to_string(r.body.size()));
  CHECK(r.header("Content-Type") == "text/html; charset=utf-8");
  CHECK(r.header("Cache-Control") == "no-store");
  REQUIRE(f.seen().size() == 1);
  CHECK(f.seen()[0].method == "GET");
  CHECK(f.seen()[0].path == "/api/status");
  CHECK(f.seen()[0].query == "run=a%20b");

  REQUIRE(s.send(get("/missing")));
  CHECK(read_reply(s).status == 404);
}

TEST_CASE("http: HEAD has the length and no body, keep-alive and pipelined requests",
          "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(s.send("HEAD /page HTTP/1.1\r\nHost: x\r\n\r\n"));
  Reply head = read_reply(s, true);
  CHECK(head.status == 200);
  CHECK(head.header("Content-Length") == std::to_string(std::string("hello /page\n").size()));
  // The next reply on the same connection starts right away: no body bytes came in between.
  REQUIRE(s.send(get("/second")));
  Reply second = read_reply(s);
  CHECK(second.status == 200);
  CHECK(second.body == "hello /second\n");
  CHECK(f.seen().at(0).method == "HEAD");
  // Two requests in one packet (pipelined): answered in order.
  REQUIRE(s.send(get("/p1") + get("/p2")));
  CHECK(read_reply(s).body == "hello /p1\n");
  CHECK(read_reply(s).body == "hello /p2\n");
  CHECK(f.server.stats().connections_total == 1);
  // Counted once a reply is written, which may come after the client has read it.
  CHECK(eventually([&] { return f.server.stats().requests == 4; }));
  CHECK_FALSE(s.closed_by_peer(100ms));
}

TEST_CASE("http: other methods are 405 with Allow, never reaching the handler",
          "[integration][http]") {
  Fixture f;
  {
    RawSocket s(f.port());
    REQUIRE(s.send("DELETE / HTTP/1.1\r\nHost: x\r\n\r\n"));
    Reply r = read_reply(s);
    CHECK(r.status == 405);
    CHECK(r.header("Allow") == "GET, HEAD");
    REQUIRE(s.send(get("/after")));  // no body: the connection goes on
    CHECK(read_reply(s).status == 200);
  }
  RawSocket s(f.port());
  REQUIRE(s.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"));
  Reply r = read_reply(s);
  CHECK(r.status == 405);
  CHECK(r.header("Connection") == "close");
  CHECK(s.closed_by_peer(10s));
  CHECK(f.calls == 1);
  CHECK(f.server.stats().rejected == 2);
}

TEST_CASE("http: a request body is refused with 413 and the connection closes",
          "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(s.send("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"));
  CHECK(read_reply(s).status == 413);
  CHECK(s.closed_by_peer(10s));
  CHECK(f.calls == 0);
}

TEST_CASE("http: a 20 KB head is rejected and the connection closed", "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(
      s.send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20 * 1024, 'a') + "\r\n\r\n"));
  Reply r = read_reply(s);
  CHECK((r.status == 431 || r.status == 0));  // the reply, or a reset that overtook it
  CHECK(s.closed_by_peer(10s));
  CHECK(f.calls == 0);
  CHECK(eventually([&] { return f.server.stats().rejected == 1; }));
}

TEST_CASE("http: garbage is answered 400 and closed", "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(s.send(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n")));
  Reply r = read_reply(s);
  CHECK((r.status == 400 || r.status == 0));
  CHECK(s.closed_by_peer(10s));
  CHECK(f.calls == 0);
}

TEST_CASE("http: a client that does not finish its request is closed after the timeout",
          "[integration][http]") {
  HttpOptions o;
  o.request_timeout = 300ms;
  Fixture f(o);
  RawSocket slow(f.port());
  REQUIRE(slow.send("GET / HTTP/1.1\r\nHost: x\r\n"));  // half a request, then nothing
  RawSocket idle(f.port());                             // nothing at all
  CHECK(slow.closed_by_peer(10s));
  CHECK(idle.closed_by_peer(10s));
  CHECK(eventually([&] { return f.server.stats().timeouts == 2; }));
  CHECK(eventually([&] { return f.server.stats().connections_open == 0; }));
  CHECK(f.calls == 0);
}

TEST_CASE("http: connections over max_connections are refused until one closes",
          "[integration][http]") {
  HttpOptions o;
  o.max_connections = 2;
  o.request_timeout = 20s;  // the held connections must outlive the test's waits
  Fixture f(o);
  auto a = std::make_unique<RawSocket>(f.port());
  RawSocket b(f.port());
  REQUIRE(eventually([&] { return f.server.stats().connections_open == 2; }));
  RawSocket over(f.port());
  Reply r = read_reply(over);
  CHECK((r.status == 503 || r.status == 0));
  CHECK(over.closed_by_peer(10s));
  CHECK(f.server.stats().connections_refused == 1);
  REQUIRE(b.send(get("/held")));  // the connections within the cap are served
  CHECK(read_reply(b).status == 200);
  a.reset();
  REQUIRE(eventually([&] { return f.server.stats().connections_open == 1; }));
  RawSocket again(f.port());
  REQUIRE(again.send(get("/again")));
  CHECK(read_reply(again).status == 200);
}

TEST_CASE("http: a throwing handler is a 500 without detail", "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(s.send(get("/throw")));
  Reply r = read_reply(s);
  CHECK(r.status == 500);
  CHECK(r.body.find("secret") == std::string::npos);
  CHECK(r.head.find("secret") == std::string::npos);
  CHECK(f.server.stats().handler_errors == 1);
  REQUIRE(s.send(get("/fine")));  // the connection survives it
  CHECK(read_reply(s).status == 200);
}

TEST_CASE("http: HTTP/1.0 without keep-alive closes after the reply", "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(s.send("GET /old HTTP/1.0\r\n\r\n"));
  Reply r = read_reply(s);
  CHECK(r.status == 200);
  CHECK(r.head.rfind("HTTP/1.0 200", 0) == 0);
  CHECK(s.closed_by_peer(10s));
}

TEST_CASE("http: stop closes every connection, is idempotent, a taken port is named",
          "[integration][http]") {
  Fixture f;
  RawSocket s(f.port());
  REQUIRE(eventually([&] { return f.server.stats().connections_open == 1; }));
  HttpOptions taken;
  taken.port = f.port();
  HttpServer second(taken, [](const HttpRequest&) { return HttpResponse{}; });
  CHECK_THROWS_WITH(second.start(), Catch::Contains("cannot listen for HTTP on 127.0.0.1:" +
                                                    std::to_string(f.port())));
  f.server.stop();
  CHECK(s.closed_by_peer(10s));
  f.server.stop();
  CHECK_THROWS_AS(f.server.start(), ddp::ConfigError);
}
