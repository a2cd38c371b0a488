// Tests of hang_policy.hpp: --on-hang's values; the node summary's codec round trip, its size
// and its refusals (each naming the field); the idle time's source; judge()'s stalled ranks
// and its straggler rules (consecutive checks, named once, the 2-rank baseline, the steps a
// rank needs before it is compared).
#include "ddp/launch/hang_policy.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;

namespace {

RankHealth rank(int r, double idle_s = 0, double median_step_s = 0, int steps_known = 0) {
  RankHealth h;
  h.rank = r;
  h.local_rank = r % 2;
  h.pid = 4000 + r;
  h.step = 12;
  h.reports = true;
  h.idle_s = idle_s;
  h.median_step_s = median_step_s;
  h.steps_known = steps_known;
  h.state = 'S';
  return h;
}

NodeSummary node(int g, std::vector<RankHealth> ranks) {
  NodeSummary s;
  s.group_rank = g;
  s.host = "host" + std::to_string(g);
  s.seq = 7;
  s.ranks = std::move(ranks);
  return s;
}

// A job of ranks 0..n-1 on one node with the given median step times, all known.
std::vector<NodeSummary> steps(const std::vector<double>& medians, int known = 10) {
  std::vector<RankHealth> ranks;
  for (std::size_t i = 0; i < medians.size(); ++i) {
    ranks.push_back(rank(static_cast<int>(i), 0, medians[i], known));
  }
  return {node(0, ranks)};
}

HangSettings stragglers_on(double factor = 2, int checks = 3) {
  HangSettings s;
  s.straggler_factor = factor;
  s.straggler_checks = checks;
  return s;
}

void check_same(const RankHealth& a, const RankHealth& b) {
  CHECK(a.rank == b.rank);
  CHECK(a.local_rank == b.local_rank);
  CHECK(a.pid == b.pid);
  CHECK(a.step == b.step);
  CHECK(a.phase == b.phase);
  CHECK(a.reports == b.reports);
  CHECK(a.idle_s == b.idle_s);
  CHECK(a.cpu_frac == b.cpu_frac);
  CHECK(a.state == b.state);
  CHECK(a.median_step_s == b.median_step_s);
  CHECK(a.steps_known == b.steps_known);
}

}  // namespace

TEST_CASE("flag --on-hang: the four actions and a refusal naming the flag", "[launch]") {
  for (auto a : {OnHang::report, OnHang::dump, OnHang::restart, OnHang::stop}) {
    CHECK(parse_on_hang(to_string(a)) == a);
  }
  CHECK(std::string(to_string(OnHang::restart)) == "restart");
  CHECK_THROWS_AS(parse_on_hang("kill"), ddp::ConfigError);
  CHECK_THROWS_WITH(parse_on_hang("Stop"), Catch::Contains("--on-hang") && Catch::Contains("Stop"));
  CHECK_FALSE(HangSettings{}.enabled());
}

TEST_CASE("a node summary decodes to what was encoded", "[launch]") {
  auto a = rank(3, 12.345678901234, 0.1, 40);
  a.phase = "all_reduce";
  a.cpu_frac = 0.987654321;
  a.state = 'D';
  a.step = 123456789012345;
  auto b = rank(4);
  b.reports = false;
  b.step = -1;
  b.state = '?';
  NodeSummary s = node(5, {a, b});
  s.host = "gpu-node-17.example";
  s.seq = 18446744073709551615ull >> 1;
  auto text = encode_summary(s);
  auto d = decode_summary(text);
  CHECK(d.group_rank == 5);
  CHECK(d.host == s.host);
  CHECK(d.seq == s.seq);
  REQUIRE(d.ranks.size() == 2);
  check_same(d.ranks[0], a);
  check_same(d.ranks[1], b);
  CHECK(text.find("all_reduce") != std::string::npos);
  CHECK(text.find("\"ph\"") == text.rfind("\"ph\""));  // an empty phase is left out

  NodeSummary empty = node(0, {});
  CHECK(decode_summary(encode_summary(empty)).ranks.empty());
}

TEST_CASE("a node summary stays well under 1 KiB per rank", "[launch]") {
  std::vector<RankHealth> ranks;
  for (int r = 0; r < 8; ++r) {
    auto h = rank(1000 + r, 123.456789012345, 0.123456789012345, 100000);
    h.phase = "backward";
    h.cpu_frac = 0.333333333333333;
    h.step = 9999999;
    ranks.push_back(h);
  }
  auto text = encode_summary(node(63, ranks));
  CHECK(text.size() < 8 * 256);
}

TEST_CASE("a bad node summary is refused, naming the field", "[launch]") {
  auto good = encode_summary(node(1, {rank(2)}));
  auto refused = [](const std::string& text, const std::string& field) {
    INFO(text);
    CHECK_THROWS_AS(decode_summary(text), ddp::ProtocolError);
    CHECK_THROWS_WITH(decode_summary(text), Catch::Contains(field));
  };
  refused("", "not JSON");
  refused("{\"g\":1", "not JSON");
  refused("[1,2]", "not a JSON object");
  refused(R"({"h":"a","q":1,"r":[]})", "'g' is missing");
  refused(R"({"g":-1,"h":"a","q":1,"r":[]})", "'g'");
  refused(R"({"g":1.5,"h":"a","q":1,"r":[]})", "'g'");
  refused(R"({"g":4294967296,"h":"a","q":1,"r":[]})", "'g'");
  refused(R"({"g":1,"h":7,"q":1,"r":[]})", "'h' must be a string");
  refused(R"({"g":1,"h":"a","q":-2,"r":[]})", "'q'");
  refused(R"({"g":1,"h":"a","q":1,"r":{}})", "'r' must be an array");
  refused(R"({"g":1,"h":"a","q":1,"r":[5]})", "'r[0]' must be an object");

  auto with = [&](const std::string& from, const std::string& to) {
    auto t = good;
    auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  refused(with("\"i\":0.0", "\"i\":-1.5"), "'r[0].i'");
  refused(with("\"i\":0.0", "\"i\":\"soon\""), "'r[0].i'");
  refused(with("\"c\":0.0", "\"c\":-0.5"), "'r[0].c'");
  refused(with("\"m\":0.0", "\"m\":null"), "'r[0].m'");
  refused(with("\"n\":0", "\"n\":-3"), "'r[0].n'");
  refused(with("\"s\":12", "\"s\":-2"), "'r[0].s'");
  refused(with("\"rp\":true", "\"rp\":1"), "'r[0].rp'");
  refused(with("\"st\":\"S\"", "\"st\":\"SR\""), "'r[0].st'");
  refused(with("\"p\":4002", "\"p\":-4"), "'r[0].p'");
  refused(with("\"r\":2", "\"x\":2"), "'r[0].r' is missing");
  // Fields it does not know are a newer agent's: ignored.
  CHECK(decode_summary(with("\"q\":7", "\"q\":7,\"zz\":[1]")).seq == 7);
}

TEST_CASE("idle time: by the progress channel when it spoke, else by CPU", "[launch]") {
  CHECK(rank_idle_s(true, 3.0, 40.0) == 3.0);
  CHECK(rank_idle_s(false, 3.0, 40.0) == 40.0);
  CHECK(rank_idle_s(false, 3.0, -1.0) == 0.0);
}

TEST_CASE("judge: the ranks idle for the timeout are stalled, sorted", "[launch]") {
  HangSettings s;
  s.timeout_s = 30;
  StragglerState st;
  auto v =
      judge({node(1, {rank(3, 31), rank(2, 5)}), node(0, {rank(1, 30), rank(0, 29.9)})}, s, st);
  CHECK(v.stalled == std::vector<int>{1, 3});
  CHECK(v.hung());
  CHECK(v.stragglers.empty());

  s.timeout_s = 0;  // off
  CHECK_FALSE(judge({node(0, {rank(0, 1e9)})}, s, st).hung());
  CHECK_FALSE(judge({}, HangSettings{}, st).hung());
}

TEST_CASE("judge: a straggler is named after consecutive checks, once", "[launch]") {
  auto s = stragglers_on(2, 3);
  StragglerState st;
  auto job = steps({1.0, 1.1, 0.9, 3.0});
  CHECK(judge(job, s, st).stragglers.empty());
  CHECK(judge(job, s, st).stragglers.empty());
  CHECK(judge(job, s, st).stragglers == std::vector<int>{3});
  CHECK(st.above[3] == 3);
  CHECK(judge(job, s, st).stragglers.empty());  // named once
  CHECK(st.above[0] == 0);
}

TEST_CASE("judge: a check below the factor starts the count again", "[launch]") {
  auto s = stragglers_on(2, 3);
  StragglerState st;
  auto slow = steps({1.0, 1.0, 1.0, 3.0});
  auto fine = steps({1.0, 1.0, 1.0, 1.5});
  judge(slow, s, st);
  judge(slow, s, st);
  judge(fine, s, st);
  CHECK(st.above[3] == 0);
  CHECK(judge(slow, s, st).stragglers.empty());
  CHECK(judge(slow, s, st).stragglers.empty());
  CHECK(judge(slow, s, st).stragglers == std::vector<int>{3});
  // At the factor exactly is not above it.
  StragglerState st2;
  for (int i = 0; i < 5; ++i) CHECK(judge(steps({1.0, 1.0, 2.0}), s, st2).stragglers.empty());
}

TEST_CASE("judge: in a 2-rank job the slow rank is compared against the other", "[launch]") {
  auto s = stragglers_on(2, 1);
  StragglerState st;
  // The mean of 1 and 3 is 2: 3 is not above 2 x 2. Against the other rank it is.
  const JobVerdict two = judge(steps({1.0, 3.0}), s, st);
  CHECK(two.stragglers == std::vector<int>{1});
  CHECK(two.straggler_baseline_s == Approx(1.0));  // the baseline the message names
  StragglerState st2;
  CHECK(judge(steps({3.0, 1.0}), s, st2).stragglers == std::vector<int>{0});
  StragglerState st3;
  CHECK(judge(steps({1.0, 1.9}), s, st3).stragglers.empty());
}

TEST_CASE("judge: stragglers across nodes, and a slow half of the job", "[launch]") {
  auto s = stragglers_on(2, 1);
  StragglerState st;
  std::vector<NodeSummary> job = {node(0, {rank(0, 0, 0.5, 8), rank(1, 0, 0.5, 8)}),
                                  node(1, {rank(2, 0, 1.6, 8), rank(3, 0, 0.5, 8)})};
  CHECK(judge(job, s, st).stragglers == std::vector<int>{2});
  StragglerState st2;
  CHECK(judge(steps({1, 1, 3, 3}), s, st2).stragglers == std::vector<int>{2, 3});
}

TEST_CASE("judge: only ranks with enough steps are compared", "[launch]") {
  auto s = stragglers_on(2, 1);
  s.straggler_min_steps = 4;
  StragglerState st;
  // One comparable rank is no comparison.
  CHECK(judge(steps({1.0, 5.0}, 3), s, st).stragglers.empty());
  std::vector<NodeSummary> job = {node(0, {rank(0, 0, 1.0, 4), rank(1, 0, 5.0, 3)})};
  CHECK(judge(job, s, st).stragglers.empty());
  job[0].ranks[1].steps_known = 4;
  CHECK(judge(job, s, st).stragglers == std::vector<int>{1});
  // A median of 0 means "not enough steps" too.
  StragglerState st2;
  CHECK(judge(steps({0.0, 5.0}), s, st2).stragglers.empty());
  // Off when the factor is 0.
  StragglerState st3;
  CHECK(judge(steps({1.0, 50.0}), HangSettings{}, st3).stragglers.empty());
  CHECK(st3.above.empty());
}
