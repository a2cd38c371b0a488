// Tests of status/record.hpp: the records' JSON round trip (every field), refusals that name
// the field, the schema version check, and the readers' derived fields (lost nodes, members,
// the job's state).
#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"
#include "ddp/status/record.hpp"

using namespace ddp::status;

namespace {
NodeStatus sample_node(int slot, const std::string& state, double updated) {
  NodeStatus n;
  n.run_id = "job7";
  n.job_id = "1234";
  n.host = "node-" + std::to_string(slot);
  n.slot = slot;
  n.agent_pid = 100 + slot;
  n.state = state;
  n.round = 2;
  n.group_rank = slot;
  n.group_world_size = 2;
  n.world_size = 4;
  n.restart_count = 1;
  n.max_restarts = 3;
  n.started_unix = 1000;
  n.updated_unix = updated;
  n.interval_s = 1;
  n.seq = 9;
  for (int l = 0; l < 2; ++l) {
    RankStatus r;
    r.local_rank = l;
    r.rank = slot * 2 + l;
    r.pid = 4000 + r.rank;
    r.state = "running";
    r.restarts = 1;
    r.last_exit = l == 1 ? std::optional<int>(-9) : std::nullopt;
    r.last_error = l == 1 ? "Signal 9 (SIGKILL)" : "";
    r.step = 120;
    r.step_time_s = 0.25;
    r.samples_per_s = 512;
    r.total_steps = 1000;
    r.cpu_frac = 0.97;
    r.rss_bytes = 123456789;
    r.gpu = l;
    if (l == 0) {
      r.gpu_util = 0.5;
      r.gpu_mem_used = 1 << 30;
      r.gpu_mem_total = 80ull << 30;
    }
    n.ranks.push_back(r);
  }
  n.restarts.push_back({1, 1010.5, "signal", "rank 3 (node-1) failed: Signal 9 (SIGKILL)"});
  n.failures_by_cause["signal"] = 1;
  n.phases.push_back({"rendezvous", 1000, 1001, ""});
  n.phases.push_back({"run", 1001, 0, "round 2"});
  return n;
}
}  // namespace

TEST_CASE("a node record survives its JSON round trip field by field", "[status]") {
  const NodeStatus n = sample_node(1, "running", 1020);
  const NodeStatus m = node_from_json(to_json(n));
  CHECK(m.run_id == "job7");
  CHECK(m.job_id == "1234");
  CHECK(m.host == "node-1");
  CHECK(m.slot == 1);
  CHECK(m.agent_pid == 101);
  CHECK(m.state == "running");
  CHECK(m.round == 2);
  CHECK(m.world_size == 4);
  CHECK(m.restart_count == 1);
  CHECK(m.max_restarts == 3);
  CHECK(m.seq == 9);
  REQUIRE(m.ranks.size() == 2);
  CHECK(m.ranks[0].gpu_util == Approx(0.5));
  CHECK(m.ranks[0].gpu_mem_total == (80ull << 30));
  CHECK_FALSE(m.ranks[1].gpu_util);
  CHECK(m.ranks[1].last_exit == -9);
  CHECK_FALSE(m.ranks[0].last_exit);
  CHECK(m.ranks[1].last_error == "Signal 9 (SIGKILL)");
  CHECK(m.ranks[1].rss_bytes == 123456789);
  CHECK(m.ranks[1].samples_per_s == Approx(512));
  CHECK(m.ranks[1].total_steps == 1000);
  REQUIRE(m.restarts.size() == 1);
  CHECK(m.restarts[0].cause == "signal");
  CHECK(m.failures_by_cause.at("signal") == 1);
  REQUIRE(m.phases.size() == 2);
  CHECK(m.phases[1].end_unix == 0);
  CHECK(m.phases[1].detail == "round 2");
  // Compact: a record with two ranks stays well under a kilobyte per rank.
  CHECK(to_json(n).size() < 2 * 1024);
}

TEST_CASE("a bad record is refused with the field named", "[status]") {
  std::string text = to_json(sample_node(0, "running", 1));
  CHECK_THROWS_WITH(node_from_json("not json"), Catch::Contains("not JSON"));
  std::string no_host = text;
  no_host.replace(no_host.find("\"host\""), 6, "\"hust\"");
  CHECK_THROWS_AS(node_from_json(no_host), ddp::ProtocolError);
  CHECK_THROWS_WITH(node_from_json(no_host), Catch::Contains("node.host is missing"));
  std::string bad_step = text;
  bad_step.replace(bad_step.find("\"step\":120"), 10, "\"step\":\"x\"");
  CHECK_THROWS_WITH(node_from_json(bad_step), Catch::Contains("node.ranks[0].step"));
  std::string newer = text;
  newer.replace(newer.find("\"schema\":1"), 10, "\"schema\":7");
  CHECK_THROWS_WITH(node_from_json(newer), Catch::Contains("schema"));
}

TEST_CASE("readers mark a silent node lost and derive the job's figures", "[status]") {
  JobStatus job;
  job.run_id = "job7";
  job.now_unix = 1100;
  job.nodes.push_back(sample_node(0, "running", 1099));
  job.nodes.push_back(sample_node(1, "running", 1000));   // 100 s silent: lost
  job.nodes.push_back(sample_node(2, "succeeded", 900));  // final: never lost
  job.nodes[2].round = 1;                                 // an earlier round's node
  fill_derived(job);
  CHECK_FALSE(job.nodes[0].lost);
  CHECK(job.nodes[1].lost);
  CHECK(job.nodes[1].ranks[0].state == "lost");
  CHECK_FALSE(job.nodes[2].lost);
  CHECK(job.round == 2);
  CHECK(job.members == 1);
  CHECK(job.ranks == 2);
  CHECK(job.state == "running");
  CHECK(job.restarts == 1);

  JobStatus back = job_from_json(to_json(job, 2));
  CHECK(back.nodes.size() == 3);
  CHECK(back.nodes[1].lost);
  CHECK(back.members == 1);

  JobStatus failing = job;
  failing.nodes[1].updated_unix = 1099;
  failing.nodes[1].state = "failed";
  fill_derived(failing);
  CHECK(failing.state == "failed");
  JobStatus empty;
  fill_derived(empty);
  CHECK(empty.state == "unknown");
}
