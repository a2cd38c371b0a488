// The agent's lines to a worker: what format_regroup and format_peer_lost write their parsers
// read back, every bad field is refused by name, and a line is told apart by its first word.
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

TEST_CASE("a peer_lost line reads back as written, and a bad one is refused by name",
          "[unit][proto][regroup]") {
  const PeerLost p{5, 2};
  const std::string line = format_peer_lost(p);
  REQUIRE(line == "peer_lost rank=5 heal=2\n");
  CHECK(parse_peer_lost(line.substr(0, line.size() - 1)) == p);
  CHECK(parse_peer_lost("peer_lost   heal=1 rank=0") == PeerLost{0, 1});
  const auto refused = [](const std::string& l) {
    try {
      parse_peer_lost(l);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(refused("peer_lostx rank=1 heal=1"), Catch::Contains("not a peer_lost line"));
  CHECK_THAT(refused("peer_lost rank=1"), Catch::Contains("'heal' missing"));
  CHECK_THAT(refused("peer_lost heal=1"), Catch::Contains("'rank' missing"));
  CHECK_THAT(refused("peer_lost rank=1 rank=2 heal=1"), Catch::Contains("'rank' given twice"));
  CHECK_THAT(refused("peer_lost rank=1 heal=0"), Catch::Contains("peer_lost heal '0'"));
  CHECK_THAT(refused("peer_lost rank=-1 heal=1"), Catch::Contains("peer_lost rank"));
  CHECK_THAT(refused("peer_lost rank=1 heal=1 colour=red"), Catch::Contains("'colour=red'"));
  CHECK_THAT(refused("peer_lost rank=1 heal=1" + std::string(600, ' ')),
             Catch::Contains("longer than 512"));
}

TEST_CASE("an agent line is told by its first word", "[unit][proto][regroup]") {
  CHECK(agent_line_kind(line_of(sample())) == "regroup");
  CHECK(agent_line_kind("peer_lost rank=1 heal=1") == "peer_lost");
  CHECK(agent_line_kind("peer_lost") == "peer_lost");
  CHECK(agent_line_kind("regrouped round=1").empty());
  CHECK(agent_line_kind("").empty());
  CHECK(agent_line_kind("hello regroup").empty());
}
