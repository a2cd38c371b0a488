// Decoder: byte-exact requests captured from torch 2.15 and 1.13 clients, every possible
// segmentation of them, dialect detection, and each limit refusing before the body arrives.
#include "ddp/proto/decoder.hpp"

#include <catch2/catch.hpp>

#include "support/hex.hpp"
#include "ddp/proto/writer.hpp"

using namespace ddp::proto;
using ddp::test::unhex;

namespace {

// Decodes from a copy that lives until the next call, so the views in `r` stay valid.
DecodeResult decode_all(Decoder& d, const std::string& bytes, Request& r) {
  static std::string keep;
  keep = bytes;
  return d.decode(std::span<const char>(keep.data(), keep.size()), r);
}

Decoder validated_v2() {
  Decoder d;
  Request r;
  auto v = unhex("00 cef7853c");
  REQUIRE(decode_all(d, v, r).status == DecodeStatus::ok);
  REQUIRE(d.dialect() == Dialect::v2);
  return d;
}

}  // namespace

TEST_CASE("torch 2.x VALIDATE selects the v2 dialect", "[unit][proto]") {
  Decoder d;
  Request r;
  auto res = decode_all(d, unhex("00 cef7853c"), r);
  REQUIRE(res.status == DecodeStatus::ok);
  CHECK(res.consumed == 5);
  CHECK(r.op == Op::validate);
  CHECK(d.dialect() == Dialect::v2);
}

TEST_CASE("torch 2.15 request captures decode field by field", "[unit][proto]") {
  auto d = validated_v2();
  Request r;
  SECTION("set") {
    auto res = decode_all(d, unhex("0102000000000000002f6b010000000000000076"), r);
    REQUIRE(res.status == DecodeStatus::ok);
    CHECK(res.consumed == 20);
    CHECK(r.op == Op::set);
    CHECK(r.keys[0] == "/k");
    CHECK(r.values[0] == "v");
  }
  SECTION("compare_set") {
    auto res =
        decode_all(d, unhex("0203000000000000002f7a7a010000000000000078010000000000000079"), r);
    REQUIRE(res.status == DecodeStatus::ok);
    CHECK(r.op == Op::compare_set);
    CHECK(r.keys[0] == "/zz");
    CHECK(r.values[0] == "x");
    CHECK(r.values[1] == "y");
  }
  SECTION("add") {
    REQUIRE(decode_all(d, unhex("0402000000000000002f6e0500000000000000"), r).status ==
            DecodeStatus::ok);
    CHECK(r.op == Op::add);
    CHECK(r.keys[0] == "/n");
    CHECK(r.i64 == 5);
  }
  SECTION("check with two keys") {
    REQUIRE(
        decode_all(d, unhex("05020000000000000002000000000000002f6b05000000000000002f6e6f7065"), r)
            .status == DecodeStatus::ok);
    CHECK(r.op == Op::check);
    REQUIRE(r.keys.size() == 2);
    CHECK(r.keys[1] == "/nope");
  }
  SECTION("multi_set") {
    REQUIRE(decode_all(d,
                       unhex("0b020000000000000002000000000000002f7001000000000000003102000000000"
                             "000002f71010000000000000032"),
                       r)
                .status == DecodeStatus::ok);
    CHECK(r.op == Op::multi_set);
    CHECK(r.keys == std::vector<std::string_view>{"/p", "/q"});
    CHECK(r.values == std::vector<std::string_view>{"1", "2"});
  }
  SECTION("num_keys, cancel_wait, list_keys carry no arguments") {
    for (auto op : {"07", "0c", "11"}) {
      auto res = decode_all(d, unhex(op), r);
      REQUIRE(res.status == DecodeStatus::ok);
      CHECK(res.consumed == 1);
    }
  }
  SECTION("ping and barrier") {
    REQUIRE(decode_all(d, unhex("0d 4d000000"), r).status == DecodeStatus::ok);
    CHECK(r.u32 == 77);
    REQUIRE(decode_all(d, unhex("12 0200000000000000 2f62 0300000000000000"), r).status ==
            DecodeStatus::ok);
    CHECK(r.op == Op::barrier);
    CHECK(r.i64 == 3);
  }
}

TEST_CASE("every split of a request is need_more until the last byte", "[unit][proto]") {
  auto frames = {
      unhex("0102000000000000002f6b010000000000000076"),
      unhex("0203000000000000002f7a7a010000000000000078010000000000000079"),
      unhex("06020000000000000002000000000000002f6102000000000000002f6e"),
      unhex("0b020000000000000002000000000000002f7001000000000000003102000000000000002f7101000000"
            "0000000032"),
  };
  for (const auto& f : frames) {
    auto d = validated_v2();
    Request r;
    for (std::size_t n = 0; n < f.size(); ++n) {
      INFO("prefix of " << n << " bytes");
      CHECK(d.decode(std::span<const char>(f.data(), n), r).status == DecodeStatus::need_more);
    }
    auto res = decode_all(d, f, r);
    CHECK(res.status == DecodeStatus::ok);
    CHECK(res.consumed == f.size());
  }
}

TEST_CASE("two pipelined requests decode one at a time", "[unit][proto]") {
  auto d = validated_v2();
  Request r;
  auto two = unhex("07 0402000000000000002f6e0500000000000000");
  auto first = decode_all(d, two, r);
  REQUIRE(first.status == DecodeStatus::ok);
  CHECK(r.op == Op::num_keys);
  auto rest = std::span<const char>(two.data() + first.consumed, two.size() - first.consumed);
  REQUIRE(d.decode(rest, r).status == DecodeStatus::ok);
  CHECK(r.op == Op::add);
}

TEST_CASE("torch 1.13 clients are recognised by their first bytes", "[unit][proto]") {
  Request r;
  SECTION("SET is opcode 00 without the magic") {
    Decoder d;
    auto res = decode_all(d, unhex("00 0200000000000000 2f6b 0100000000000000 76"), r);
    REQUIRE(res.status == DecodeStatus::ok);
    CHECK(d.dialect() == Dialect::v1_13);
    CHECK(r.op == Op::set);
    CHECK(r.values[0] == "v");
  }
  SECTION("ADD init/ is opcode 03") {
    Decoder d;
    auto res = decode_all(d, unhex("03 0500000000000000 696e69742f 0100000000000000"), r);
    REQUIRE(res.status == DecodeStatus::ok);
    CHECK(d.dialect() == Dialect::v1_13);
    CHECK(r.op == Op::add);
    CHECK(r.keys[0] == "init/");
    // later opcodes use the 1.13 table: 02 is GET, 05 WAIT, 08 DELETE_KEY
    REQUIRE(decode_all(d, unhex("02 0200000000000000 2f6b"), r).status == DecodeStatus::ok);
    CHECK(r.op == Op::get);
    REQUIRE(decode_all(d, unhex("08 0200000000000000 2f6b"), r).status == DecodeStatus::ok);
    CHECK(r.op == Op::delete_key);
  }
  SECTION("WATCH_KEY and opcodes past 8 are refused") {
    Decoder d;
    REQUIRE(decode_all(d, unhex("06"), r).status == DecodeStatus::ok);
    auto watch = decode_all(d, unhex("07 0200000000000000 2f6b"), r);
    CHECK(watch.status == DecodeStatus::error);
    CHECK(watch.error.find("WATCH_KEY") != std::string::npos);
    CHECK(decode_all(d, unhex("09"), r).status == DecodeStatus::error);
  }
}

TEST_CASE("limits refuse a request from its length prefix alone", "[unit][proto]") {
  Limits lim;
  lim.max_key_bytes = 16;
  lim.max_value_bytes = 32;
  lim.max_keys_per_request = 4;
  lim.max_request_bytes = 1024;
  Request r;
  auto fresh = [&] {
    Decoder d(lim);
    auto v = unhex("00 cef7853c");
    REQUIRE(decode_all(d, v, r).status == DecodeStatus::ok);
    return d;
  };
  SECTION("key too long") {
    auto d = fresh();
    auto res = decode_all(d, unhex("01 1100000000000000"), r);  // 17-byte key, body absent
    REQUIRE(res.status == DecodeStatus::error);
    CHECK(res.error.find("key of 17 bytes exceeds the limit of 16") != std::string::npos);
  }
  SECTION("value too long") {
    auto d = fresh();
    auto res = decode_all(d, unhex("01 0100000000000000 6b 2100000000000000"), r);
    REQUIRE(res.status == DecodeStatus::error);
    CHECK(res.error.find("value of 33 bytes") != std::string::npos);
  }
  SECTION("too many keys") {
    auto d = fresh();
    auto res = decode_all(d, unhex("06 0500000000000000"), r);
    REQUIRE(res.status == DecodeStatus::error);
    CHECK(res.error.find("5 keys") != std::string::npos);
  }
  SECTION("a length near 2^64 does not wrap around") {
    auto d = fresh();
    auto res = decode_all(d, unhex("03 ffffffffffffffff 00"), r);
    CHECK(res.status == DecodeStatus::error);
  }
  SECTION("negative MULTI_SET count") {
    auto d = fresh();
    CHECK(decode_all(d, unhex("0b ffffffffffffffff"), r).status == DecodeStatus::error);
  }
  SECTION("an unfinished request larger than max_request_bytes") {
    Limits big = lim;
    big.max_value_bytes = 4096;
    Decoder d(big);
    std::string req = unhex("00 cef7853c");
    REQUIRE(decode_all(d, req, r).status == DecodeStatus::ok);
    std::string set = unhex("01 0100000000000000 6b 0010000000000000");  // 4096-byte value
    set += std::string(1100, 'x');
    auto res = decode_all(d, set, r);
    REQUIRE(res.status == DecodeStatus::error);
    CHECK(res.error.find("exceeds the limit of 1024 bytes") != std::string::npos);
  }
  SECTION("unknown opcode") {
    auto d = fresh();
    auto res = decode_all(d, unhex("7f"), r);
    REQUIRE(res.status == DecodeStatus::error);
    CHECK(res.error.find("unknown opcode 127") != std::string::npos);
  }
}

TEST_CASE("a first byte that no client sends is refused", "[unit][proto]") {
  Decoder d;
  Request r;
  auto res = decode_all(d, std::string("GET / HTTP/1.1\r\n"), r);
  CHECK(res.status == DecodeStatus::error);
}

TEST_CASE("Writer output decodes back to the same request", "[unit][proto]") {
  std::string buf;
  Writer w(buf);
  w.op(Dialect::v2, Op::validate).value<std::uint32_t>(kValidateMagic);
  w.op(Dialect::v2, Op::compare_set).bytes("key").bytes("").bytes(std::string(3000, 'z'));
  w.op(Dialect::v2, Op::lease_grant).value<std::int64_t>(1500).u8(1);
  Decoder d;
  Request r;
  std::span<const char> rest(buf.data(), buf.size());
  auto a = d.decode(rest, r);
  REQUIRE(a.status == DecodeStatus::ok);
  rest = rest.subspan(a.consumed);
  auto b = d.decode(rest, r);
  REQUIRE(b.status == DecodeStatus::ok);
  CHECK(r.keys[0] == "key");
  CHECK(r.values[0].empty());
  CHECK(r.values[1].size() == 3000);
  rest = rest.subspan(b.consumed);
  REQUIRE(d.decode(rest, r).status == DecodeStatus::ok);
  CHECK(r.op == Op::lease_grant);
  CHECK(r.i64 == 1500);
  CHECK(r.u8 == 1);
}
