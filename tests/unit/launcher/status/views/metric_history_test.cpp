// Tests of metric_history.hpp, history_export.hpp and the job summary (record.hpp): a history's
// memory stays bounded over a million points and still spans the whole run, the names it
// keeps, thinning, combining ranks and nodes (throughput summed, the rest averaged), the
// records' JSON with metrics and histories (a bad one named), CSV and JSON lines, and the job's
// step, ETA and goodput. Pure: no sockets, no clock.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/proto/error.hpp"
#include "ddp/status/history_export.hpp"
#include "ddp/status/metric_history.hpp"
#include "ddp/status/record.hpp"

using namespace ddp::status;

TEST_CASE("metric history: a million points in bounded memory, the whole run covered",
          "[metrics]") {
  MetricHistory h(512, 4);
  for (std::int64_t s = 0; s < 1000000; ++s) {
    h.add("loss", s, 1000.0 + static_cast<double>(s), 1.0 / static_cast<double>(s + 1));
  }
  const Series all = h.series();
  const auto& pts = all.at("loss");
  CHECK(h.points() <= 512);
  CHECK(pts.size() <= 513);  // the kept points and the newest
  CHECK(pts.front().step == 0);
  CHECK(pts.back().step == 999999);
  CHECK(pts.back().value == Approx(1e-6));
  CHECK(h.latest().at("loss") == Approx(1e-6));
  for (std::size_t i = 1; i < pts.size(); ++i) CHECK(pts[i].step > pts[i - 1].step);
  // The points are evenly spread: no gap longer than twice the stride's share.
  std::int64_t gap = 0;
  for (std::size_t i = 1; i + 1 < pts.size(); ++i)
    gap = std::max(gap, pts[i].step - pts[i - 1].step);
  CHECK(gap <= 2 * 1000000 / 256);
  CHECK(h.bytes() <= 512 * sizeof(MetricPoint) + 512);
}

TEST_CASE("metric history: names past the limit are dropped and counted", "[metrics]") {
  MetricHistory h(8, 2);
  h.add("a", 1, 1, 1);
  h.add("b", 1, 1, 2);
  h.add("c", 1, 1, 3);
  h.add("a", 2, 2, 4);
  CHECK(h.latest().size() == 2);
  CHECK(h.latest().at("a") == 4);
  CHECK(h.dropped_keys() == 1);
  CHECK(h.series(1).at("a").size() == 1);  // thinned to one: the newest
  CHECK(h.series(1).at("a")[0].value == 4);
}

TEST_CASE("thin keeps the first and the last", "[metrics]") {
  std::vector<MetricPoint> p;
  for (int i = 0; i < 100; ++i) p.push_back({i, static_cast<double>(i), 0});
  const auto t = thin(p, 5);
  REQUIRE(t.size() == 5);
  CHECK(t.front().step == 0);
  CHECK(t[2].step == 50);
  CHECK(t.back().step == 99);
  CHECK(thin(p, 200).size() == 100);
  CHECK(thin(p, 0).empty());
}

TEST_CASE("combine: throughput adds up, other metrics average, on one wall-clock grid",
          "[metrics]") {
  Series a, b;
  for (int i = 0; i < 4; ++i) {
    const double t = 100 + i;
    a["loss"].push_back({i, t, 2.0});
    a["samples_per_s"].push_back({i, t, 100});
    b["loss"].push_back({i, t + 0.5, 4.0});  // b reports half a second after a
    b["samples_per_s"].push_back({i, t + 0.5, 50});
  }
  b["loss"].push_back({4, 104.5, 4.0});  // b has the most points: its times are the grid
  const Series both = combine({&a, &b}, 64);
  const auto& loss = both.at("loss");
  REQUIRE(loss.size() == 5);
  CHECK(loss[0].unix == 100.5);
  CHECK(loss[0].value == 3.0);  // (2 + 4) / 2
  const auto& sps = both.at("samples_per_s");
  REQUIRE(sps.size() == 4);
  CHECK(sps[0].unix == 100);   // a's grid (equal sizes: the first)
  CHECK(sps[0].value == 100);  // b has no value yet at t=100
  CHECK(sps[1].value == 150);  // 100 + 50
  CHECK(combine({}, 8).empty());
}

namespace {

NodeStatus node(int slot, double started) {
  NodeStatus n;
  n.run_id = "r";
  n.host = "h,\"" + std::to_string(slot);
  n.slot = slot;
  n.state = "running";
  n.round = 1;
  n.started_unix = started;
  n.updated_unix = 1000;
  n.interval_s = 1;
  RankStatus r;
  r.state = "running";
  r.step = 100 + slot;
  r.total_steps = 200;
  r.step_time_s = 0.5;
  r.samples_per_s = 64;
  r.metrics = {{"loss", 1.0 + slot}, {"tokens_per_s", 1000}};
  n.ranks = {r};
  n.history["loss"] = {{100, 990, 1.0 + slot}, {101, 995, 0.5 + slot}};
  return n;
}

}  // namespace

TEST_CASE("records carry metrics and histories, and a bad one is named", "[metrics]") {
  NodeStatus n = node(0, 900);
  n.ranks[0].bad_metrics = 3;
  const NodeStatus back = node_from_json(to_json(n));
  CHECK(back.ranks[0].metrics == n.ranks[0].metrics);
  CHECK(back.ranks[0].bad_metrics == 3);
  REQUIRE(back.history.at("loss").size() == 2);
  CHECK(back.history.at("loss")[1].value == 0.5);
  auto j = nlohmann::json::parse(to_json(n));
  j["history"]["loss"][0] = {1, 2};
  CHECK_THROWS_WITH(node_from_json(j.dump()),
                    Catch::Contains("node.history.loss") && Catch::Contains("[step, time, value]"));
  j = nlohmann::json::parse(to_json(n));
  j["ranks"][0]["metrics"]["bad name"] = 1;
  CHECK_THROWS_WITH(node_from_json(j.dump()), Catch::Contains("node.ranks[0].metrics.bad name"));
}

TEST_CASE("the job summary: slowest step, ETA, goodput, metrics summed or averaged", "[metrics]") {
  JobStatus job;
  job.run_id = "r";
  job.now_unix = 1000;
  job.nodes = {node(0, 900), node(1, 950)};
  job.nodes[0].phases = {{"rendezvous", 900, 902, ""},
                         {"run", 902, 950, ""},
                         {"restart", 950, 955, ""},
                         {"rendezvous", 955, 960, ""}};
  fill_derived(job);
  CHECK(job.step == 100);  // the slower node's
  CHECK(job.total_steps == 200);
  CHECK(job.samples_per_s == 128);
  CHECK(job.eta_s == Approx(50));  // 100 steps at 0.5 s
  CHECK(job.metrics.at("loss") == 1.5);
  CHECK(job.metrics.at("tokens_per_s") == 2000);
  CHECK(job.wall_s == 100);
  CHECK(job.lost_s == 10);  // the restart, and the second rendezvous
  CHECK(job.goodput == Approx(0.9));
  const JobStatus back = job_from_json(to_json(job));
  CHECK(back.eta_s == job.eta_s);
  CHECK(back.metrics == job.metrics);
}

TEST_CASE("history export: JSON, CSV and JSON lines", "[metrics]") {
  JobStatus job;
  job.run_id = "r";
  job.now_unix = 1000;
  job.nodes = {node(0, 900), node(1, 900)};
  fill_derived(job);
  const auto j =
      nlohmann::json::parse(export_history(job, HistoryFormat::json_object, HistoryScope::all));
  CHECK(j["job"]["loss"][0][2] == 1.5);  // (1 + 2) / 2
  CHECK(j["nodes"][1]["history"]["loss"][1][2] == 1.5);
  CHECK(!nlohmann::json::parse(export_history(job, HistoryFormat::json_object, HistoryScope::job))
             .contains("nodes"));
  std::istringstream csv(export_history(job, HistoryFormat::csv, HistoryScope::all));
  std::vector<std::string> rows;
  for (std::string l; std::getline(csv, l);) rows.push_back(l);
  REQUIRE(rows.size() == 1 + 2 + 4);
  CHECK(rows[0] == "scope,slot,host,metric,step,time,value");
  CHECK(rows[1] == "job,,,loss,100,990.0,1.5");
  CHECK(rows[3] == "node,0,\"h,\"\"0\",loss,100,990.0,1.0");
  std::istringstream lines(export_history(job, HistoryFormat::json_lines, HistoryScope::nodes));
  int n = 0;
  for (std::string l; std::getline(lines, l); ++n) {
    const auto row = nlohmann::json::parse(l);
    CHECK(row["scope"] == "node");
    CHECK(row["metric"] == "loss");
  }
  CHECK(n == 4);
  CHECK(!parse_history_format("xml"));
  CHECK(!parse_history_scope(""));
}
