// Dispatch, bytes in and bytes out: each request/reply pair below was captured between a
// torch 2.15 client and torch 2.15's own libuv server; ours must answer byte for byte alike.
#include "dispatch.hpp"

#include <catch2/catch.hpp>

#include "support/hex.hpp"

using namespace ddp::rdzv;
using namespace ddp::proto;
using ddp::test::hex;
using ddp::test::unhex;

namespace {

struct Harness {
  KvTable table;
  Decoder decoder;
  Request req;
  bool prefix = false;

  Harness() {
    auto v = unhex("00 cef7853c");
    decoder.decode(std::span<const char>(v.data(), v.size()), req);
  }

  // Returns the reply hex, or "waiting" / "failed: <why>".
  std::string run(std::string_view request_hex, WaiterId self = 1, Woken* woken = nullptr) {
    auto bytes = unhex(request_hex);
    auto res = decoder.decode(std::span<const char>(bytes.data(), bytes.size()), req);
    REQUIRE(res.status == DecodeStatus::ok);
    REQUIRE(res.consumed == bytes.size());
    std::string out;
    Woken local;
    DispatchContext ctx{table, self, Millis(0), prefix, out, woken ? *woken : local, {}};
    auto o = dispatch(req, ctx);
    if (o == Outcome::waiting) return "waiting";
    if (o == Outcome::failed) return "failed: " + ctx.error;
    return hex(out);
  }
};

}  // namespace

TEST_CASE("replies match torch 2.15's server byte for byte", "[unit][rdzv]") {
  Harness h;
  // the client's connect-time ADD init/ 1 (world_size given), as in the capture
  CHECK(h.run("04 0500000000000000 696e69742f 0100000000000000") == "0100000000000000");
  CHECK(h.run("0102000000000000002f6b010000000000000076") == "");                // set /k v
  CHECK(h.run("06010000000000000002000000000000002f6b") == "00");                // wait /k
  CHECK(h.run("0302000000000000002f6b") == "010000000000000076");                // get /k
  CHECK(h.run("0402000000000000002f6e0500000000000000") == "0500000000000000");  // add /n 5
  CHECK(h.run("0202000000000000002f6b010000000000000076010000000000000077") ==
        "010000000000000077");  // cas /k v->w
  CHECK(h.run("0203000000000000002f7a7a010000000000000078010000000000000079") ==
        "010000000000000078");  // cas on a missing key with expected "x" returns "x"
  CHECK(h.run("05020000000000000002000000000000002f6b05000000000000002f6e6f7065") == "01");
  CHECK(h.run("07") == "0300000000000000");                          // num_keys
  CHECK(h.run("0802000000000000002f6b") == "0100000000000000");      // delete /k
  CHECK(h.run("0902000000000000002f6102000000000000007879") == "");  // append /a xy
  CHECK(h.run("0a020000000000000002000000000000002f6102000000000000002f6e") ==
        "02000000000000007879010000000000000035");  // multi_get /a /n
  CHECK(h.run("0b020000000000000002000000000000002f7001000000000000003102000000000000002f71010000"
              "000000000032") == "");                                        // multi_set
  CHECK(h.run("0e03000000000000002f7171050000000000000068656c6c6f") == "");  // queue_push
  CHECK(h.run("1003000000000000002f7171") == "0100000000000000");            // queue_len
  CHECK(h.run("0f03000000000000002f7171") ==
        "0100000000000000050000000000000068656c6c6f");             // queue_pop
  CHECK(h.run("0f03000000000000002f7171") == "0000000000000000");  // pop empty
  CHECK(h.run("0d4d000000") == "4d000000");                        // ping 77
  CHECK(h.run("0302000000000000002f7a") == "0000000000000000");    // get missing
}

TEST_CASE("cas on a missing key with empty expected creates it", "[unit][rdzv]") {
  Harness h;
  // compare_set("/s", "", "Y2FuaW1hZGFt") as the c10d rendezvous backend does at start
  CHECK(h.run("0202000000000000002f7300000000000000000c0000000000000059324675615731685a474674") ==
        "0c0000000000000059324675615731685a474674");
  CHECK(*h.table.get("/s") == "Y2FuaW1hZGFt");
}

TEST_CASE("wait defers, a set by another client wakes it", "[unit][rdzv]") {
  Harness h;
  CHECK(h.run("06010000000000000002000000000000002f63", 7) == "waiting");
  Woken woken;
  CHECK(h.run("0102000000000000002f63010000000000000031", 8, &woken) == "");
  CHECK(woken == Woken{7});
}

TEST_CASE("barrier releases everyone at world size", "[unit][rdzv]") {
  Harness h;
  CHECK(h.run("1202000000000000002f620200000000000000", 1) == "waiting");
  Woken woken;
  CHECK(h.run("1202000000000000002f620200000000000000", 2, &woken) == "00");
  CHECK(woken == Woken{1});
  CHECK(*h.table.get("/b") == "2");  // ASCII counter, as torch stores it
  CHECK(h.run("1202000000000000002f620000000000000000", 3).rfind("failed: BARRIER", 0) == 0);
}

TEST_CASE("ADD on a value that is not a number fails the request", "[unit][rdzv]") {
  Harness h;
  h.run("0102000000000000002f6b010000000000000076");  // /k = "v"
  auto r = h.run("0402000000000000002f6b0100000000000000");
  CHECK(r.rfind("failed: ADD on key '/k' whose value is not a number", 0) == 0);
}

TEST_CASE("after HELLO every reply starts with a status byte", "[unit][rdzv]") {
  Harness h;
  h.prefix = true;
  CHECK(h.run("80 01000000") == "0001000000");
  CHECK(h.run("0402000000000000002f6e0500000000000000") == "000500000000000000");
  CHECK(h.run("0102000000000000002f6b010000000000000076") == "");  // no reply, no status
  // lease: grant 0 ms bound to the connection, attach a key, revoke
  CHECK(h.run("81 0000000000000000 01") == "000100000000000000");
  CHECK(h.run("84 0200000000000000 2f6c 0100000000000000 31 0100000000000000") == "0000");
  CHECK(h.table.get("/l") != nullptr);
  CHECK(h.run("83 0100000000000000") == "0000");
  CHECK(h.table.get("/l") == nullptr);
  CHECK(h.run("83 0100000000000000") == "0001");  // already gone
  CHECK(h.run("81 0000000000000000 00").rfind("failed: LEASE_GRANT needs", 0) == 0);
  CHECK(h.run("81 ffffffffffffff7f 00").rfind("failed: LEASE_GRANT ttl of", 0) == 0);
}
