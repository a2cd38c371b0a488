// render_metrics (status/metrics.hpp): the exposition format (HELP and TYPE once per family,
// contiguous families, escaping), what a lost node, an absent GPU and no job look like, and
// the store's counters. Pure: records built in memory.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/status/metrics.hpp"

using namespace ddp::status;

namespace {

RankStatus make_rank(int local, int rank, const std::string& state) {
  RankStatus r;
  r.local_rank = local;
  r.rank = rank;
  r.pid = 1000 + rank;
  r.state = state;
  r.step = 42;
  r.step_time_s = 0.25;
  r.samples_per_s = 512;
  r.cpu_frac = 0.5;
  r.rss_bytes = 123456789;
  return r;
}

NodeStatus make_node(const std::string& run, int slot, int restarts) {
  NodeStatus n;
  n.run_id = run;
  n.host = "host" + std::to_string(slot);
  n.slot = slot;
  n.state = "running";
  n.round = 2;
  n.restart_count = restarts;
  n.max_restarts = 3;
  n.started_unix = 1700000000.5;
  n.updated_unix = 1700000100.25;
  n.ranks = {make_rank(0, 2 * slot, "running"), make_rank(1, 2 * slot + 1, "running")};
  return n;
}

JobStatus make_job(const std::string& run) {
  JobStatus j;
  j.run_id = run;
  j.now_unix = 1700000101;
  j.nodes = {make_node(run, 0, 1), make_node(run, 1, 0)};
  fill_derived(j);
  return j;
}

// The value of the sample written exactly as `series` (name{labels}), or "" when absent.
std::string value_of(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return line.substr(series.size() + 1);
    }
  }
  return "";
}

bool has_family(const std::string& text, const std::string& name) {
  return text.find("# TYPE " + name + " ") != std::string::npos;
}

std::string metric_name(const std::string& sample_line) {
  return sample_line.substr(0, sample_line.find_first_of("{ "));
}

// Every sample belongs to the family whose HELP and TYPE came just before it; each family
// has exactly one HELP and one TYPE and its samples are contiguous. Returns the family names.
std::vector<std::string> check_structure(const std::string& text) {
  std::vector<std::string> families;
  std::set<std::string> seen;
  std::string current;
  bool help = false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    REQUIRE(!line.empty());
    if (line.rfind("# HELP ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
      INFO(current);
      REQUIRE(seen.insert(current).second);
      families.push_back(current);
      help = true;
    } else if (line.rfind("# TYPE ", 0) == 0) {
      REQUIRE(help);
      REQUIRE(line.substr(7, current.size() + 1) == current + " ");
      const std::string type = line.substr(7 + current.size() + 1);
      CHECK((type == "gauge" || type == "counter"));
      const bool total = current.size() > 6 && current.substr(current.size() - 6) == "_total";
      CHECK(total == (type == "counter"));
      help = false;
    } else {
      INFO(line);
      REQUIRE(!help);
      REQUIRE(metric_name(line) == current);
      REQUIRE(current.rfind("ddprun_", 0) == 0);
    }
  }
  CHECK((text.empty() || text.back() == '\n'));
  return families;
}

}  // namespace

TEST_CASE("metrics: a running two-node job", "[status][metrics]") {
  const std::string text = render_metrics({make_job("r1")}, std::nullopt);
  check_structure(text);
  CHECK(value_of(text, "ddprun_jobs") == "1");
  CHECK(value_of(text, "ddprun_job_round{run_id=\"r1\"}") == "2");
  CHECK(value_of(text, "ddprun_job_members{run_id=\"r1\"}") == "2");
  CHECK(value_of(text, "ddprun_job_ranks{run_id=\"r1\"}") == "4");
  CHECK(value_of(text, "ddprun_job_restarts_total{run_id=\"r1\"}") == "1");
  CHECK(value_of(text, "ddprun_job_max_restarts{run_id=\"r1\"}") == "3");
  CHECK(value_of(text, "ddprun_job_state{run_id=\"r1\",state=\"running\"}") == "1");
  CHECK(value_of(text, "ddprun_node_up{run_id=\"r1\",node=\"host1:1\"}") == "1");
  CHECK(value_of(text, "ddprun_node_restarts_total{run_id=\"r1\",node=\"host0:0\"}") == "1");
  CHECK(value_of(text, "ddprun_node_start_time_seconds{run_id=\"r1\",node=\"host0:0\"}") ==
        "1700000000.5");
  const std::string r3 = "{run_id=\"r1\",node=\"host1:1\",rank=\"3\",local_rank=\"1\"}";
  CHECK(value_of(text,
                 "ddprun_rank_state{run_id=\"r1\",node=\"host1:1\",rank=\"3\","
                 "local_rank=\"1\",state=\"running\"}") == "1");
  CHECK(value_of(text, "ddprun_rank_step" + r3) == "42");
  CHECK(value_of(text, "ddprun_rank_step_seconds" + r3) == "0.25");
  CHECK(value_of(text, "ddprun_rank_samples_per_second" + r3) == "512");
  CHECK(value_of(text, "ddprun_rank_cpu_ratio" + r3) == "0.5");
  CHECK(value_of(text, "ddprun_rank_rss_bytes" + r3) == "123456789");
  CHECK(value_of(text, "ddprun_rank_restarts_total" + r3) == "0");
  CHECK_FALSE(has_family(text, "ddprun_rank_last_exit_code"));  // nobody exited yet
  CHECK_FALSE(has_family(text, "ddprun_rank_total_steps"));
  CHECK_FALSE(has_family(text, "ddprun_store_connections"));  // no store given
}

TEST_CASE("metrics: failures are summed over nodes, every cause present", "[status][metrics]") {
  JobStatus j = make_job("r1");
  j.nodes[0].failures_by_cause = {{"signal", 1}, {"exitcode", 2}};
  j.nodes[1].failures_by_cause = {{"signal", 3}, {"weird \"one\"", 1}};
  const std::string text = render_metrics({j}, std::nullopt);
  check_structure(text);
  CHECK(value_of(text, "ddprun_failures_total{run_id=\"r1\",cause=\"signal\"}") == "4");
  CHECK(value_of(text, "ddprun_failures_total{run_id=\"r1\",cause=\"exitcode\"}") == "2");
  for (const char* c : kCauses) {
    INFO(c);
    CHECK_FALSE(
        value_of(text, std::string("ddprun_failures_total{run_id=\"r1\",cause=\"") + c + "\"}")
            .empty());
  }
  CHECK(value_of(text, "ddprun_failures_total{run_id=\"r1\",cause=\"hang\"}") == "0");
  CHECK(value_of(text, "ddprun_failures_total{run_id=\"r1\",cause=\"weird \\\"one\\\"\"}") == "1");
}

TEST_CASE("metrics: label values are escaped", "[status][metrics]") {
  CHECK(escape_label_value("plain") == "plain");
  CHECK(escape_label_value("a\\b") == "a\\\\b");
  CHECK(escape_label_value("say \"hi\"") == "say \\\"hi\\\"");
  CHECK(escape_label_value("two\nlines") == "two\\nlines");
  CHECK(escape_label_value("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 kept
  CHECK(escape_label_value("bad\xff\xc3") == "bad??");        // not UTF-8: replaced

  JobStatus j = make_job("run \"x\"\\\n");
  const std::string text = render_metrics({j}, std::nullopt);
  check_structure(text);
  CHECK(value_of(text, "ddprun_job_ranks{run_id=\"run \\\"x\\\"\\\\\\n\"}") == "4");
  // No raw newline inside a sample: every line is a comment or starts with a metric name.
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) CHECK((line[0] == '#' || line.rfind("ddprun_", 0) == 0));
}

TEST_CASE("metrics: a lost node is down, its ranks lost and not sampled", "[status][metrics]") {
  JobStatus j = make_job("r1");
  j.nodes[1].updated_unix = j.now_unix - 60;  // stopped publishing
  fill_derived(j);
  REQUIRE(j.nodes[1].lost);
  const std::string text = render_metrics({j}, std::nullopt);
  check_structure(text);
  CHECK(value_of(text, "ddprun_node_up{run_id=\"r1\",node=\"host1:1\"}") == "0");
  CHECK(value_of(text, "ddprun_node_up{run_id=\"r1\",node=\"host0:0\"}") == "1");
  CHECK(value_of(text, "ddprun_node_state{run_id=\"r1\",node=\"host1:1\",state=\"lost\"}") == "1");
  const std::string r2 = "{run_id=\"r1\",node=\"host1:1\",rank=\"2\",local_rank=\"0\"";
  CHECK(value_of(text, "ddprun_rank_state" + r2 + ",state=\"lost\"}") == "1");
  CHECK(value_of(text, "ddprun_rank_state" + r2 + ",state=\"running\"}").empty());
  CHECK(value_of(text, "ddprun_rank_step" + r2 + "}") == "42");  // the last step it reported
  CHECK(value_of(text, "ddprun_rank_cpu_ratio" + r2 + "}").empty());
  CHECK(value_of(text, "ddprun_rank_rss_bytes" + r2 + "}").empty());
  CHECK(value_of(text, "ddprun_job_members{run_id=\"r1\"}") == "1");
}

TEST_CASE("metrics: GPU families only when NVML gave numbers", "[status][metrics]") {
  JobStatus j = make_job("r1");
  std::string text = render_metrics({j}, std::nullopt);
  CHECK_FALSE(has_family(text, "ddprun_rank_gpu_utilization_ratio"));
  CHECK_FALSE(has_family(text, "ddprun_rank_gpu_memory_used_bytes"));
  CHECK_FALSE(has_family(text, "ddprun_rank_gpu_memory_total_bytes"));

  auto& r = j.nodes[0].ranks[1];
  r.gpu = 1;
  r.gpu_util = 0.75;
  r.gpu_mem_used = 2048;
  r.gpu_mem_total = 4096;
  text = render_metrics({j}, std::nullopt);
  check_structure(text);
  const std::string l = "{run_id=\"r1\",node=\"host0:0\",rank=\"1\",local_rank=\"1\",gpu=\"1\"}";
  CHECK(value_of(text, "ddprun_rank_gpu_utilization_ratio" + l) == "0.75");
  CHECK(value_of(text, "ddprun_rank_gpu_memory_used_bytes" + l) == "2048");
  CHECK(value_of(text, "ddprun_rank_gpu_memory_total_bytes" + l) == "4096");

  r.state = "failed";  // the process is gone: nothing sampled
  r.last_exit = -9;
  text = render_metrics({j}, std::nullopt);
  CHECK_FALSE(has_family(text, "ddprun_rank_gpu_utilization_ratio"));
  CHECK(value_of(text,
                 "ddprun_rank_last_exit_code{run_id=\"r1\",node=\"host0:0\",rank=\"1\","
                 "local_rank=\"1\"}") == "-9");
}

TEST_CASE("metrics: no job, an empty job, and the store's counters", "[status][metrics]") {
  std::string text = render_metrics({}, std::nullopt);
  CHECK(check_structure(text) == std::vector<std::string>{"ddprun_jobs"});
  CHECK(value_of(text, "ddprun_jobs") == "0");

  JobStatus empty;
  empty.run_id = "r0";
  fill_derived(empty);
  ddp::rdzv::ServerStats s;
  s.connections_open = 3;
  s.connections_total = 7;
  s.requests_by_op[static_cast<std::size_t>(ddp::rdzv::OpKind::set)] = 11;
  s.requests_by_op[static_cast<std::size_t>(ddp::rdzv::OpKind::delete_key)] = 2;
  s.bytes_received = 1000;
  s.bytes_sent = 2000;
  s.keys = 5;
  s.table_bytes = 640;
  text = render_metrics({empty}, s);
  check_structure(text);
  CHECK(value_of(text, "ddprun_jobs") == "1");
  CHECK(value_of(text, "ddprun_job_round{run_id=\"r0\"}") == "-1");
  CHECK(value_of(text, "ddprun_job_state{run_id=\"r0\",state=\"unknown\"}") == "1");
  CHECK_FALSE(has_family(text, "ddprun_node_up"));
  CHECK_FALSE(has_family(text, "ddprun_rank_state"));
  CHECK(value_of(text, "ddprun_store_connections") == "3");
  CHECK(value_of(text, "ddprun_store_connections_total") == "7");
  CHECK(value_of(text, "ddprun_store_requests_total{op=\"set\"}") == "11");
  CHECK(value_of(text, "ddprun_store_requests_total{op=\"delete\"}") == "2");
  CHECK(value_of(text, "ddprun_store_requests_total{op=\"multi_get\"}") == "0");
  CHECK(value_of(text, "ddprun_store_received_bytes_total") == "1000");
  CHECK(value_of(text, "ddprun_store_sent_bytes_total") == "2000");
  CHECK(value_of(text, "ddprun_store_keys") == "5");
  CHECK(value_of(text, "ddprun_store_table_bytes") == "640");
  for (std::size_t i = 0; i < ddp::rdzv::kOpKinds; ++i) {
    const auto name = ddp::rdzv::op_kind_name(static_cast<ddp::rdzv::OpKind>(i));
    INFO(name);
    CHECK_FALSE(
        value_of(text, "ddprun_store_requests_total{op=\"" + std::string(name) + "\"}").empty());
  }
}

TEST_CASE("metrics: output order does not depend on input order", "[status][metrics]") {
  JobStatus a = make_job("a"), b = make_job("b");
  const std::string first = render_metrics({a, b}, std::nullopt);
  std::reverse(b.nodes.begin(), b.nodes.end());
  std::reverse(b.nodes[0].ranks.begin(), b.nodes[0].ranks.end());
  const std::string second = render_metrics({b, a}, std::nullopt);
  CHECK(first == second);
  CHECK(first.find("run_id=\"a\"") < first.find("run_id=\"b\""));
}

TEST_CASE("metrics: requests map to their kind", "[status][metrics]") {
  using ddp::proto::Op;
  using ddp::rdzv::op_kind;
  using ddp::rdzv::OpKind;
  CHECK(op_kind(Op::set) == OpKind::set);
  CHECK(op_kind(Op::set_with_lease) == OpKind::set);
  CHECK(op_kind(Op::barrier) == OpKind::wait);
  CHECK(op_kind(Op::delete_key) == OpKind::delete_key);
  CHECK(op_kind(Op::lease_keepalive) == OpKind::lease);
  CHECK(op_kind(Op::validate) == OpKind::other);
  CHECK(op_kind(Op::queue_pop) == OpKind::other);
  CHECK(ddp::rdzv::op_kind_name(OpKind::delete_key) == "delete");
}
