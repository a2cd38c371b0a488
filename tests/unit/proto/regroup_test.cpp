// The agent's regroup line: what format_regroup writes parse_regroup reads back, and every bad
// field is refused by name.
#include <catch2/catch.hpp>
#include <string>

#include "ddp/proto/error.hpp"
#include "ddp/proto/regroup.hpp"

using namespace ddp;

namespace {
Regroup sample() {
  Regroup r;
  r.round = 7;
  r.rank = 3;
  r.world = 6;
  r.local_rank = 1;
  r.local_world = 2;
  r.group_rank = 1;
  r.group_world = 3;
  r.master_addr = "10.0.0.5";
  r.master_port = 41234;
  r.joining = 2;
  return r;
}

std::string line_of(const Regroup& r) {
  std::string s = format_regroup(r);
  REQUIRE(s.back() == '\n');
  s.pop_back();
  return s;
}

std::string refusal(const std::string& line) {
  try {
    parse_regroup(line);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a regroup line reads back as written", "[unit][proto][regroup]") {
  const Regroup r = sample();
  CHECK(parse_regroup(line_of(r)) == r);
  Regroup v6 = r;
  v6.master_addr = "fe80::1";  // the port is after the last colon
  CHECK(parse_regroup(line_of(v6)) == v6);
  CHECK(line_of(r) ==
        "regroup round=7 rank=3 world=6 local_rank=1 local_world=2 group_rank=1 group_world=3 "
        "master=10.0.0.5:41234 joining=2");
}

TEST_CASE("a bad regroup line is refused by name", "[unit][proto][regroup]") {
  const std::string good = line_of(sample());
  CHECK_THAT(refusal("hello"), Catch::Contains("not a regroup line"));
  CHECK_THAT(refusal("regroupx round=1"), Catch::Contains("not a regroup line"));
  CHECK_THAT(refusal("regroup round=1"), Catch::Contains("'rank' missing"));
  CHECK_THAT(refusal(good + " rank=1"), Catch::Contains("'rank' given twice"));
  CHECK_THAT(refusal(good + " colour=red"), Catch::Contains("unknown field 'colour'"));
  CHECK_THAT(refusal(good + " junk"), Catch::Contains("'junk' is not key=value"));
  std::string bad = good;
  bad.replace(bad.find("rank=3"), 6, "rank=x");
  CHECK_THAT(refusal(bad), Catch::Contains("regroup rank 'x' is not an integer"));
  bad = good;
  bad.replace(bad.find("rank=3"), 6, "rank=6");
  CHECK_THAT(refusal(bad), Catch::Contains("rank is not below world"));
  bad = good;
  bad.replace(bad.find("world=6"), 7, "world=0");
  CHECK_THAT(refusal(bad), Catch::Contains("regroup world '0'"));
  bad = good;
  bad.replace(bad.find(":41234"), 6, ":0");
  CHECK_THAT(refusal(bad), Catch::Contains("master port"));
  bad = good;
  bad.replace(bad.find("master=10.0.0.5:41234"), 21, "master=nowhere");
  CHECK_THAT(refusal(bad), Catch::Contains("not <addr>:<port>"));
  CHECK_THAT(refusal(good + std::string(600, ' ')), Catch::Contains("longer than 512"));
  bad = good;
  bad.replace(bad.find("joining=2"), 9, "joining=6");
  CHECK_THAT(refusal(bad), Catch::Contains("joining is not below world"));
}
