// Tests of trace.hpp: a node's trace through the store codec (round trip, bounds, errors that
// name the field) and the merged Chrome trace (valid JSON, metadata, order across two nodes on
// one clock, a phase still going, empty input).
#include "ddp/launch/trace.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;
using nlohmann::json;

namespace {

constexpr double kT = 1700000000.0;  // a wall clock base

NodeTrace node(int slot, const std::string& host, int group_rank, double offset) {
  NodeTrace t;
  t.slot = slot;
  t.host = host;
  t.group_rank = group_rank;
  t.phases = {{"rendezvous", kT + offset, kT + offset + 0.5, "round 0"},
              {"spawn", kT + offset + 0.5, kT + offset + 0.6, "2 workers"},
              {"run", kT + offset + 0.6, kT + offset + 3.0, ""}};
  for (int lr = 0; lr < 2; ++lr) {
    RankSteps r;
    r.rank = group_rank * 2 + lr;
    for (int s = 0; s < 3; ++s) {
      const double start = kT + offset + 1.0 + 0.25 * s;
      r.steps.push_back({s, start, start + 0.2});
    }
    t.ranks[lr] = r;
  }
  return t;
}

std::vector<json> of_phase(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_CASE("node trace: round trip through the store codec", "[unit][launch][trace]") {
  NodeTrace t = node(3, "host-b", 1, 0.123456);
  t.phases.push_back({"restart", kT + 4, 0, "local rank 1 failed"});  // still going
  const std::string text = encode_node_trace(t);
  CHECK(text.find('\n') == std::string::npos);  // compact
  const NodeTrace back = decode_node_trace(text);
  CHECK(back.slot == 3);
  CHECK(back.host == "host-b");
  CHECK(back.group_rank == 1);
  REQUIRE(back.phases.size() == t.phases.size());
  for (std::size_t i = 0; i < t.phases.size(); ++i) {
    CHECK(back.phases[i].name == t.phases[i].name);
    CHECK(back.phases[i].detail == t.phases[i].detail);
    CHECK(back.phases[i].start_unix == Approx(t.phases[i].start_unix).margin(2e-6));
    CHECK(back.phases[i].end_unix == Approx(t.phases[i].end_unix).margin(2e-6));
  }
  CHECK(back.phases.back().end_unix == 0);
  REQUIRE(back.ranks.size() == 2);
  for (const auto& [lr, r] : t.ranks) {
    const RankSteps& b = back.ranks.at(lr);
    CHECK(b.rank == r.rank);
    REQUIRE(b.steps.size() == r.steps.size());
    for (std::size_t i = 0; i < r.steps.size(); ++i) {
      CHECK(b.steps[i].step == r.steps[i].step);
      CHECK(b.steps[i].start_unix == Approx(r.steps[i].start_unix).margin(2e-6));
      CHECK(b.steps[i].end_unix == Approx(r.steps[i].end_unix).margin(2e-6));
    }
  }
  // Empty: still a valid record.
  const NodeTrace empty = decode_node_trace(encode_node_trace(NodeTrace{}));
  CHECK(empty.phases.empty());
  CHECK(empty.ranks.empty());
}

TEST_CASE("node trace: encode keeps the newest steps within the bounds", "[unit][launch][trace]") {
  NodeTrace t;
  RankSteps r;
  for (std::size_t s = 0; s < kTraceSteps + 10; ++s) {
    const double start = kT + static_cast<double>(s);
    r.steps.push_back({static_cast<std::int64_t>(s), start, start + 0.5});
  }
  t.ranks[0] = r;
  const NodeTrace back = decode_node_trace(encode_node_trace(t));
  REQUIRE(back.ranks.at(0).steps.size() == kTraceSteps);
  CHECK(back.ranks.at(0).steps.front().step == 10);
}

TEST_CASE("node trace: bad input is a ProtocolError naming the field", "[unit][launch][trace]") {
  const std::string good = encode_node_trace(node(0, "h", 0, 0));
  const auto fails_with = [](const std::string& text, const std::string& what) {
    INFO(text.substr(0, 200));
    CHECK_THROWS_AS(decode_node_trace(text), ddp::ProtocolError);
    CHECK_THROWS_WITH(decode_node_trace(text), Catch::Contains(what));
  };
  fails_with("not json", "not JSON");
  fails_with("[1,2]", "not a JSON object");
  json j = json::parse(good);
  j.erase("host");
  fails_with(j.dump(), "host is missing");
  j = json::parse(good);
  j["v"] = 2;
  fails_with(j.dump(), "v is 2");
  j = json::parse(good);
  j["slot"] = "zero";
  fails_with(j.dump(), "slot is not an integer");
  j = json::parse(good);
  j["phases"][1][1] = -5;
  fails_with(j.dump(), "phases[1].start");
  j = json::parse(good);
  j["phases"][0] = json::array({"x", 1});
  fails_with(j.dump(), "phases[0] is not an array of 4");
  j = json::parse(good);
  j["ranks"][1][2][2][2] = "long";
  fails_with(j.dump(), "ranks[1].steps[2].dur");
  j = json::parse(good);
  j["ranks"][1][0] = 0;
  fails_with(j.dump(), "ranks[1].local_rank repeats 0");
  // Absurd sizes are refused before they are built.
  j = json::parse(good);
  j["ranks"][0][2] = json::array();
  for (std::size_t i = 0; i <= kTraceSteps; ++i) j["ranks"][0][2].push_back({0, 0, 0});
  fails_with(j.dump(), "ranks[0].steps has 4097 entries");
  j = json::parse(good);
  j["phases"] = json::array();
  for (std::size_t i = 0; i <= kTraceMaxPhases; ++i) j["phases"].push_back({"p", 0, 0, ""});
  fails_with(j.dump(), "phases has");
  fails_with(std::string(kTraceMaxBytes + 1, ' '), "more than");
}

TEST_CASE("chrome trace: two nodes on one clock, metadata, order", "[unit][launch][trace]") {
  // Node slot 1 started 2 s before node slot 0: its events come first.
  const std::string text = chrome_trace({node(0, "a", 0, 2.0), node(1, "b", 1, 0.0)});
  const json doc = json::parse(text);  // valid JSON
  CHECK(doc.at("displayTimeUnit") == "ms");
  CHECK(doc.at("otherData").at("t0_unix").get<double>() == Approx(kT));
  const auto& ev = doc.at("traceEvents");
  REQUIRE(ev.is_array());
  // Metadata: one process per node, the launcher thread and one thread per rank.
  std::set<std::string> names;
  for (const auto& m : of_phase(doc, "M")) {
    if (m.at("name") == "process_name" || m.at("name") == "thread_name") {
      names.insert(std::to_string(m.at("pid").get<int>()) + ":" +
                   std::to_string(m.at("tid").get<int>()) + ":" +
                   m.at("args").at("name").get<std::string>());
    }
  }
  CHECK(names.count("1:0:node a (slot 0, group rank 0)") == 1);
  CHECK(names.count("2:0:node b (slot 1, group rank 1)") == 1);
  CHECK(names.count("1:0:launcher") == 1);
  CHECK(names.count("1:1:rank 0 (local 0)") == 1);
  CHECK(names.count("2:2:rank 3 (local 1)") == 1);
  // Complete events: 3 phases and 6 steps per node, ts non-decreasing, from 0.
  const auto x = of_phase(doc, "X");
  REQUIRE(x.size() == 18);
  std::int64_t last = -1;
  bool meta_done = false;
  for (const auto& e : ev) {
    if (e.at("ph") == "M") {
      CHECK_FALSE(meta_done);  // metadata first
      continue;
    }
    meta_done = true;
    const auto ts = e.at("ts").get<std::int64_t>();
    CHECK(ts >= last);
    last = ts;
  }
  CHECK(x.front().at("ts") == 0);
  CHECK(x.front().at("pid") == 2);  // node b's rendezvous, the earliest event
  CHECK(x.front().at("name") == "rendezvous");
  CHECK(x.front().at("cat") == "launcher");
  CHECK(x.front().at("dur") == 500000);
  CHECK(x.front().at("args").at("detail") == "round 0");
  // Node a's rendezvous is 2 s later on the common clock.
  bool found = false;
  for (const auto& e : x) {
    if (e.at("pid") == 1 && e.at("name") == "rendezvous") {
      CHECK(e.at("ts") == 2000000);
      found = true;
    }
    if (e.at("cat") == "step") {
      CHECK(e.at("tid").get<int>() >= 1);
      CHECK(e.at("dur") == 200000);
    }
  }
  CHECK(found);
  int steps = 0;
  for (const auto& e : x) {
    if (e.at("name") == "step 2" && e.at("pid") == 1 && e.at("tid") == 2) {
      CHECK(e.at("ts") == 3500000);  // 2 + 1 + 0.5 s
      CHECK(e.at("args").at("rank") == 1);
      ++steps;
    }
  }
  CHECK(steps == 1);
}

TEST_CASE("chrome trace: a phase still going ends at the last event", "[unit][launch][trace]") {
  NodeTrace t = node(0, "a", 0, 0);
  t.phases.back().end_unix = 0;  // "run" still going; the last event ends at 3.0 s... or later
  t.ranks[0].steps.push_back({3, kT + 5.0, kT + 5.5});
  const json doc = json::parse(chrome_trace({t}));
  bool found = false;
  for (const auto& e : of_phase(doc, "X")) {
    if (e.at("name") != "run") continue;
    found = true;
    CHECK(e.at("ts") == 600000);
    CHECK(e.at("dur") == 5500000 - 600000);
    CHECK(e.at("args").at("open") == true);
  }
  CHECK(found);
}

TEST_CASE("chrome trace: empty input is a valid empty trace", "[unit][launch][trace]") {
  const json doc = json::parse(chrome_trace({}));
  CHECK(doc.at("traceEvents").empty());
  CHECK(doc.at("displayTimeUnit") == "ms");
  CHECK(doc.at("otherData").at("nodes") == 0);
  // A node with nothing yet: its metadata only.
  NodeTrace bare;
  bare.host = "h";
  const json one = json::parse(chrome_trace({bare}));
  CHECK(of_phase(one, "X").empty());
  CHECK_FALSE(of_phase(one, "M").empty());
}
