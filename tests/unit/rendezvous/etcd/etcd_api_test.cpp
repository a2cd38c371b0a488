// etcd v3 JSON gateway bodies (etcd/api.hpp) without a server: base64 both ways (every length,
// binary bytes, bad text refused), prefix ends, the request shapes etcd expects (int64 as
// strings, base64 keys, txn compare targets), and the answers as etcd 3.4's gateway writes them
// (numbers as strings, zero fields left out, stream messages wrapped in "result", errors).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/etcd/api.hpp"

using namespace ddp::rdzv::etcd;
using nlohmann::json;

TEST_CASE("etcd base64 round-trips every length and byte and refuses bad text", "[etcd]") {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  for (std::size_t n = 0; n <= all.size(); n += (n < 8 ? 1 : 37)) {
    const std::string s = all.substr(0, n);
    CHECK(base64_decode(base64_encode(s)) == s);
  }
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_decode("L2RkcHJ1bi9r") == "/ddprun/k");
  CHECK_THROWS_AS(base64_decode("abc"), ddp::ProtocolError);
  CHECK_THROWS_AS(base64_decode("ab!d"), ddp::ProtocolError);
  CHECK_THROWS_AS(base64_decode("a=bc"), ddp::ProtocolError);
}

TEST_CASE("etcd prefix_end is the next key after every key with the prefix", "[etcd]") {
  CHECK(prefix_end("/a/") == "/a0");
  CHECK(prefix_end("ab") == "ac");
  CHECK(prefix_end(std::string("a\xff", 2)) == "b");
  CHECK(prefix_end("") == std::string(1, '\0'));
  CHECK(prefix_end(std::string("\xff\xff", 2)) == std::string(1, '\0'));
}

TEST_CASE("etcd request bodies carry base64 keys and int64 as strings", "[etcd]") {
  Op r = Op::range("/p/k", prefix_end("/p/k"));
  r.revision = 42;
  r.count_only = true;
  const json jr = json::parse(range_body(r));
  CHECK(jr["key"] == base64_encode("/p/k"));
  CHECK(jr["range_end"] == base64_encode("/p/l"));
  CHECK(jr["revision"] == "42");
  CHECK(jr["count_only"] == true);

  Op p = Op::put("k", std::string("v\0w", 3), 7);
  p.prev_kv = true;
  const json jp = json::parse(put_body(p));
  CHECK(base64_decode(jp["value"].get<std::string>()) == std::string("v\0w", 3));
  CHECK(jp["lease"] == "7");
  CHECK(jp["prev_kv"] == true);

  Compare absent{"k", Compare::Target::create, Compare::Result::equal, 0, {}};
  Compare same{"k", Compare::Target::value, Compare::Result::equal, 0, "old"};
  const json jt = json::parse(txn_body({absent, same}, {Op::put("k", "new")}, {Op::range("k")}));
  CHECK(jt["compare"][0]["target"] == "CREATE");
  CHECK(jt["compare"][0]["create_revision"] == "0");
  CHECK(jt["compare"][1]["target"] == "VALUE");
  CHECK(jt["compare"][1]["value"] == base64_encode("old"));
  CHECK(jt["success"][0].contains("request_put"));
  CHECK(jt["failure"][0].contains("request_range"));

  const json jw = json::parse(watch_body("/p/", prefix_end("/p/"), 9, true));
  CHECK(jw["create_request"]["start_revision"] == "9");
  CHECK(jw["create_request"]["prev_kv"] == true);
  CHECK(json::parse(lease_grant_body(5))["TTL"] == "5");
  CHECK(json::parse(lease_id_body(123))["ID"] == "123");
}

TEST_CASE("etcd answers are read as the 3.4 gateway writes them", "[etcd]") {
  const std::string range =
      R"({"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437",)"
      R"("revision":"7","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"5",)"
      R"("mod_revision":"7","version":"3","value":"YmFy"}],"count":"1"})";
  const RangeResult r = parse_range(range);
  CHECK(r.header.revision == 7);
  CHECK(r.header.member_id == 10276657743932975437ull);
  REQUIRE(r.kvs.size() == 1);
  CHECK(r.kvs[0].key == "foo");
  CHECK(r.kvs[0].value == "bar");
  CHECK(r.kvs[0].version == 3);
  CHECK(r.kvs[0].lease == 0);  // left out when zero
  CHECK(parse_range(R"({"header":{"revision":"7"}})").kvs.empty());

  // A failed compare: "succeeded" left out, the failure branch's range answered.
  const TxnResult t = parse_txn(
      R"({"header":{"revision":"8"},"responses":[{"response_range":{"header":{"revision":"8"},)"
      R"("kvs":[{"key":"aw==","value":"b2xk","mod_revision":"6"}],"count":"1"}}]})");
  CHECK_FALSE(t.succeeded);
  REQUIRE(t.ranges.size() == 1);
  CHECK(t.ranges[0].kvs.at(0).value == "old");
  const TxnResult ok =
      parse_txn(R"({"header":{"revision":"9"},"succeeded":true,"responses":[{"response_put":)"
                R"({"header":{"revision":"9"}}}]})");
  CHECK(ok.succeeded);
  CHECK(ok.writes.size() == 1);

  CHECK(parse_lease_grant(R"({"header":{},"ID":"7587871234","TTL":"5"})").id == 7587871234);
  CHECK_THROWS_AS(parse_lease_grant(R"({"header":{}})"), ddp::ProtocolError);
  CHECK(parse_keepalive(R"({"result":{"header":{},"ID":"1","TTL":"4"}})") == 4);
  CHECK(parse_keepalive(R"({"result":{"header":{},"ID":"1"}})") == 0);  // expired

  const WatchMessage created =
      parse_watch_message(R"({"result":{"header":{"revision":"9"},"created":true}})");
  CHECK(created.created);
  CHECK(created.events.empty());
  const WatchMessage del = parse_watch_message(
      R"({"result":{"header":{"revision":"10"},"events":[{"type":"DELETE","kv":{"key":"aw==",)"
      R"("mod_revision":"10"},"prev_kv":{"key":"aw==","value":"d2lsbA==","lease":"77"}},)"
      R"({"kv":{"key":"aw==","value":"dg==","version":"1"}}]}})");
  REQUIRE(del.events.size() == 2);
  CHECK(del.events[0].deleted);
  REQUIRE(del.events[0].prev_kv);
  CHECK(del.events[0].prev_kv->value == "will");
  CHECK(del.events[0].prev_kv->lease == 77);
  CHECK_FALSE(del.events[1].deleted);  // PUT is the zero value: no "type"
  CHECK(del.events[1].kv.value == "v");
}

TEST_CASE("etcd errors and garbage are refused by name", "[etcd]") {
  const std::string err = R"({"error":"etcdserver: requested lease not found","code":5})";
  CHECK(error_message(err) == "etcdserver: requested lease not found (code 5)");
  CHECK_THROWS_WITH(parse_keepalive(err), Catch::Contains("requested lease not found"));
  CHECK(error_message(R"({"error":{"grpc_code":14,"message":"unavailable"}})") == "unavailable");
  CHECK(error_message("{}").empty());
  CHECK_THROWS_WITH(parse_range("not json"), Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(parse_range(R"({"count":"x1"})"), Catch::Contains("count"));
  CHECK_THROWS_AS(parse_range(R"({"kvs":[{"key":"***="}]})"), ddp::ProtocolError);
  CHECK_THROWS_AS(parse_range(R"({"kvs":{}})"), ddp::ProtocolError);
}
