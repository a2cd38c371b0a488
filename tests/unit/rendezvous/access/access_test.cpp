// Access policy without sockets (rdzv/access.hpp): addresses and CIDRs parsed and matched
// (IPv4 as mapped IPv6), bad lists named, the admission decision, and the log rate limit.
#include "ddp/rdzv/access.hpp"

#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"

using namespace ddp::rdzv;

namespace {
IpAddr ip(const char* text) {
  IpAddr a;
  REQUIRE(parse_ip(text, a));
  return a;
}
}  // namespace

TEST_CASE("CIDRs match their addresses, IPv4 and IPv6", "[unit][access]") {
  const auto net = parse_cidr("10.77.0.0/16");
  CHECK(net.str() == "10.77.0.0/16");
  CHECK(net.contains(ip("10.77.3.4")));
  CHECK_FALSE(net.contains(ip("10.78.0.1")));
  CHECK_FALSE(net.contains(ip("::ffff:10.78.0.1")));
  CHECK(net.contains(ip("::ffff:10.77.0.9")));  // a v4 peer of a dual-stack listener
  CHECK(parse_cidr("192.168.1.77/24").str() == "192.168.1.0/24");  // host bits cleared
  const auto one = parse_cidr("192.168.1.7");
  CHECK(one.contains(ip("192.168.1.7")));
  CHECK_FALSE(one.contains(ip("192.168.1.8")));
  const auto v6 = parse_cidr("fd00::/8");
  CHECK(v6.contains(ip("fd12:3456::1")));
  CHECK_FALSE(v6.contains(ip("fe80::1")));
  CHECK(parse_cidr("0.0.0.0/0").contains(ip("8.8.8.8")));
  CHECK_FALSE(parse_cidr("0.0.0.0/0").contains(ip("2001:db8::1")));
  CHECK(parse_cidr("10.1.2.3/31").contains(ip("10.1.2.2")));
  CHECK(ip("127.0.0.5").is_loopback());
  CHECK(ip("::1").is_loopback());
  CHECK_FALSE(ip("10.0.0.1").is_loopback());
  CHECK(ip("[::1]").str() == "::1");
}

TEST_CASE("bad networks are named", "[unit][access]") {
  CHECK_THROWS_WITH(parse_cidr("10.0.0/8"), Catch::Contains("'10.0.0/8' is not an IP address"));
  CHECK_THROWS_WITH(parse_cidr("10.0.0.0/33"), Catch::Contains("prefix length"));
  CHECK_THROWS_WITH(parse_cidr("fd00::/129"), Catch::Contains("prefix length"));
  CHECK_THROWS_WITH(parse_cidr("10.0.0.0/x"), Catch::Contains("prefix length"));
  CHECK_THROWS_WITH(parse_cidr("node1"), Catch::Contains("'node1' is not an IP address"));
  CHECK_THROWS_WITH(parse_cidrs("10.0.0.0/8,,::1", "--store-allow"),
                    Catch::Contains("--store-allow: an empty entry"));
  CHECK_THROWS_WITH(parse_cidrs("10.0.0.0/8,nope", "--allow-unauthenticated"),
                    Catch::Contains("--allow-unauthenticated: 'nope'"));
  std::string many;
  for (int i = 0; i < 257; ++i) many += (i ? "," : "") + std::string("10.0.0.1");
  CHECK_THROWS_WITH(parse_cidrs(many, "--store-allow"), Catch::Contains("more than 256"));
  CHECK(parse_cidrs(" 10.0.0.0/8 , ::1", "x").size() == 2);
}

TEST_CASE("who is admitted, who must authenticate, who is refused", "[unit][access]") {
  AccessPolicy open;  // today's ddprund: everyone
  CHECK(classify(open, ip("10.9.9.9")) == Access::admit);
  AccessPolicy secret;
  secret.has_secret = true;
  secret.trusted = {parse_cidr("10.77.0.0/16")};
  CHECK(classify(secret, ip("10.77.0.2")) == Access::admit);
  CHECK(classify(secret, ip("10.9.9.9")) == Access::authenticate);
  CHECK(classify(secret, ip("127.0.0.1")) == Access::authenticate);  // loopback only if listed
  AccessPolicy round;                                                // a workers' store, no secret
  round.trusted = loopback_networks();
  round.closed = true;
  round.trusted.push_back(parse_cidr("10.77.0.1"));
  CHECK(classify(round, ip("127.0.0.1")) == Access::admit);
  CHECK(classify(round, ip("10.77.0.1")) == Access::admit);
  CHECK(classify(round, ip("10.77.0.3")) == Access::refuse);
  round.has_secret = true;  // with a secret the outsider may still authenticate
  CHECK(classify(round, ip("10.77.0.3")) == Access::authenticate);
}

TEST_CASE("on loopback a by-user store admits its own user, root and the listed uids only",
          "[unit][access]") {
  AccessPolicy p;
  p.trusted = loopback_networks();
  p.closed = true;
  p.by_user = true;
  p.own_uid = 1000;
  p.uids = {1500};
  CHECK(needs_uid(p, ip("127.0.0.1")));
  CHECK(needs_uid(p, ip("::1")));
  CHECK_FALSE(needs_uid(p, ip("10.0.0.1")));  // another host: its address rules, as before
  CHECK(classify(p, ip("127.0.0.1"), 1000u) == Access::admit);
  CHECK(classify(p, ip("127.0.0.1"), 0u) == Access::admit);  // root
  CHECK(classify(p, ip("127.0.0.1"), 1500u) == Access::admit);
  CHECK(classify(p, ip("127.0.0.1"), 1001u) == Access::refuse);
  CHECK(classify(p, ip("127.0.0.1")) == Access::refuse);  // the kernel did not say: refused
  p.has_secret = true;  // a secret does not let another user in on loopback either
  CHECK(classify(p, ip("127.0.0.1"), 1001u) == Access::refuse);
  p.by_user = false;  // any user: as before
  CHECK(classify(p, ip("127.0.0.1"), 1001u) == Access::admit);
}

TEST_CASE("uid lists take numbers, names and any, and name a bad entry", "[unit][access]") {
  const auto lookup = [](const std::string& name) -> std::optional<std::uint32_t> {
    if (name == "alice") return 1001;
    return std::nullopt;
  };
  CHECK_FALSE(parse_uids("any", "--store-allow-uids", lookup).has_value());
  CHECK(parse_uids("", "--store-allow-uids", lookup)->empty());
  CHECK(*parse_uids("1500,alice,0", "--store-allow-uids", lookup) ==
        std::vector<std::uint32_t>{1500, 1001, 0});
  CHECK_THROWS_WITH(parse_uids("bob", "--store-allow-uids", lookup),
                    Catch::Contains("--store-allow-uids: no user named 'bob'"));
  CHECK_THROWS_WITH(parse_uids("1,,2", "--store-allow-uids", lookup),
                    Catch::Contains("an empty entry"));
  CHECK_THROWS_WITH(parse_uids("99999999999", "--store-allow-uids", lookup),
                    Catch::Contains("--store-allow-uids"));
  std::string many;
  for (int i = 0; i < 257; ++i) many += (i ? "," : "") + std::to_string(i);
  CHECK_THROWS_WITH(parse_uids(many, "x", lookup), Catch::Contains("more than 256"));
}

TEST_CASE("refusals are logged at most `burst` per period, the rest counted", "[unit][access]") {
  LogRateLimit limit(2, std::chrono::seconds(10));
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  std::uint64_t held = 99;
  CHECK(limit.allow(t0, held));
  CHECK(held == 0);
  CHECK(limit.allow(t0 + std::chrono::seconds(1), held));
  for (int i = 0; i < 5; ++i) CHECK_FALSE(limit.allow(t0 + std::chrono::seconds(2), held));
  CHECK(limit.allow(t0 + std::chrono::seconds(11), held));
  CHECK(held == 5);  // the next line says how many were held back
  CHECK(limit.allow(t0 + std::chrono::seconds(12), held));
  CHECK(held == 0);
}
