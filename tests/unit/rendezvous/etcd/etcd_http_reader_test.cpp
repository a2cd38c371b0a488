// ResponseReader (etcd/http_reader.hpp) without sockets: etcd's three response shapes (a unary
// answer with Content-Length, a chunked error with a trailer, a watch stream whose messages do
// not line up with chunks), fed whole and one byte at a time, and malformed or oversized input
// refused by name; and the etcd endpoint list (etcd/http.hpp) parsed or refused by name.
#include <catch2/catch.hpp>
#include <string>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/etcd/http.hpp"
#include "ddp/rdzv/etcd/http_reader.hpp"

using ddp::rdzv::etcd::ResponseReader;

namespace {

// The body, fed whole (bytewise = false) or a byte at a time.
std::string read_all(const std::string& raw, bool bytewise, ResponseReader& r) {
  std::string body;
  if (bytewise) {
    for (char c : raw) {
      r.feed(std::string_view(&c, 1));
      body += r.take_body();
    }
  } else {
    r.feed(raw);
    body = r.take_body();
  }
  return body;
}

}  // namespace

TEST_CASE("etcd HTTP reader: Content-Length, chunked with trailers, split anywhere", "[etcd]") {
  for (bool bytewise : {false, true}) {
    CAPTURE(bytewise);
    ResponseReader unary;
    CHECK(read_all("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
                   "\r\n{\"count\":1}",
                   bytewise, unary) == "{\"count\":1}");
    CHECK(unary.complete());
    CHECK(unary.status() == 200);
    CHECK(unary.keep_alive());

    ResponseReader error;
    const std::string err = R"({"error":"bad","code":3})";
    CHECK(read_all("HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\nTrailer: "
                   "Grpc-Trailer-Content-Type\r\n\r\n" +
                       std::string("18\r\n") + err +
                       "\r\n0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n",
                   bytewise, error) == err);
    CHECK(error.complete());
    CHECK(error.status() == 400);
  }
}

TEST_CASE("etcd HTTP reader: a watch stream hands out its body while it goes on", "[etcd]") {
  // The messages {"a":1}\n{}\n cut into chunks of 5, 4, 1 and 1 bytes.
  ResponseReader r;
  r.feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n");
  CHECK(r.headers_done());
  CHECK(r.take_body() == "{\"a\":");
  r.feed("4\r\n1}\n{");  // a whole chunk, its CRLF not yet come
  CHECK(r.take_body() == "1}\n{");
  CHECK_FALSE(r.complete());
  r.feed("\r\n1\r\n}\r\n1\r\n\n\r\n");
  CHECK(r.take_body() == "}\n");
  r.feed("0\r\n\r\n");
  CHECK(r.complete());
  CHECK_THROWS_AS(r.feed("x"), ddp::ProtocolError);
}

TEST_CASE("etcd HTTP reader refuses malformed and oversized responses", "[etcd]") {
  auto refuses = [](const std::string& raw, const char* says) {
    ResponseReader r;
    CHECK_THROWS_WITH(r.feed(raw), Catch::Contains(says));
  };
  refuses("SMTP 220 hello\r\n\r\n", "not a status line");
  refuses("HTTP/1.1 2x0 OK\r\n\r\n", "bad status code");
  refuses("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length");
  refuses("HTTP/1.1 200 OK\r\n\r\n", "neither Content-Length nor chunked");
  refuses("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size");
  refuses("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc", "CRLF");
  refuses("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(100, '1'),
          "chunk-size line");
  refuses("HTTP/1.1 200 OK\r\nX: " + std::string(ResponseReader::kMaxHeaderBytes, 'a'),
          "headers over");
  ResponseReader closing;
  closing.feed("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  CHECK(closing.complete());
  CHECK_FALSE(closing.keep_alive());
}

TEST_CASE("etcd endpoints: lists, schemes and the default port, bad ones by name", "[etcd]") {
  using ddp::rdzv::etcd::parse_etcd_endpoints;
  const auto eps = parse_etcd_endpoints("h1:2379,http://h2:2389/,h3");
  REQUIRE(eps.size() == 3);
  CHECK(eps[0].str() == "h1:2379");
  CHECK(eps[1].str() == "h2:2389");
  CHECK(eps[2].str() == "h3:2379");
  bool https = false;
  CHECK(parse_etcd_endpoints("https://h1:2379,https://h2", &https).size() == 2);
  CHECK(https);
  CHECK(parse_etcd_endpoints("h1,http://h2", &https).size() == 2);
  CHECK_FALSE(https);
  CHECK_THROWS_WITH(parse_etcd_endpoints("https://h1,http://h2"),
                    Catch::Contains("mix http:// and https://"));
  CHECK_THROWS_WITH(parse_etcd_endpoints("h1:2379,h2:99999"), Catch::Contains("h2:99999"));
  CHECK_THROWS_AS(parse_etcd_endpoints("h1,"), ddp::ConfigError);
  std::string many;
  for (int i = 0; i < 65; ++i) many += (i ? ",h" : "h") + std::to_string(i);
  CHECK_THROWS_WITH(parse_etcd_endpoints(many), Catch::Contains("more than 64"));
}
