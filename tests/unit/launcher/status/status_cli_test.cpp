// unit/launch/status_cli_test.cpp: `ddprun status` without a store: the table from hand-made
// JobStatus values (alignment, a lost node, GPU columns, long errors cut) and the flags.
#include <catch2/catch.hpp>
#include <sstream>

#include "ddp/launch/status_cli.hpp"
#include "ddp/proto/error.hpp"

using ddp::launch::format_status_table;
using ddp::launch::parse_status_args;
using ddp::status::JobStatus;
using ddp::status::NodeStatus;
using ddp::status::RankStatus;

namespace {

// The table's lines without its job line (tested on its own below).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("job  ", 0) != 0) out.push_back(line);
  }
  return out;
}

RankStatus rank(int local, int global, int pid) {
  RankStatus r;
  r.local_rank = local;
  r.rank = global;
  r.pid = pid;
  r.state = "running";
  r.step = 120;
  r.total_steps = 1000;
  r.step_time_s = 0.212;
  r.samples_per_s = 3450;
  r.cpu_frac = 0.98;
  r.rss_bytes = 300ull << 20;
  return r;
}

NodeStatus node(const std::string& host, int slot, int first_rank, double updated) {
  NodeStatus n;
  n.run_id = "job-7";
  n.host = host;
  n.slot = slot;
  n.state = "running";
  n.round = 1;
  n.group_rank = slot;
  n.restart_count = 1;
  n.max_restarts = 3;
  n.updated_unix = updated;
  n.ranks = {rank(0, first_rank, 100 + first_rank), rank(1, first_rank + 1, 101 + first_rank)};
  return n;
}

// Two nodes at t=1000: node 1 last published at t=980, so it is lost.
JobStatus two_nodes() {
  JobStatus job;
  job.run_id = "job-7";
  job.now_unix = 1000;
  job.nodes = {node("alpha", 0, 0, 999.5), node("beta-long-hostname", 1, 2, 980)};
  ddp::status::fill_derived(job);
  return job;
}

// The column where `title` starts in the title line.
std::size_t column(const std::vector<std::string>& lines, const std::string& title) {
  const auto at = lines.at(1).find(title);
  REQUIRE(at != std::string::npos);
  return at;
}

}  // namespace

TEST_CASE("status table: header line and one row per rank, grouped by node", "[status_cli]") {
  const auto lines = lines_of(format_status_table(two_nodes()));
  REQUIRE(lines.size() == 6);  // header, titles, 2 x 2 ranks
  CHECK(lines[0] == "run job-7  state running  round 1  nodes 1 (1 lost)  ranks 2  restarts 1/3");
  CHECK(lines[1].rfind("NODE", 0) == 0);
  for (const char* t : {"RANK", "LOCAL", "STATE", "RESTARTS", "STEP", "STEP TIME", "SAMPLES/S",
                        "CPU", "RSS", "GPU", "LAST ERROR"}) {
    CHECK(lines[1].find(t) != std::string::npos);
  }
  CHECK(lines[2].rfind("alpha #0 ", 0) == 0);
  CHECK(lines[3].rfind("    ", 0) == 0);  // the node's second rank: no node name again
  CHECK(lines[4].rfind("beta-long-hostname #1 LOST (silent 20.00 s)", 0) == 0);
  CHECK(lines[3].find("running") != std::string::npos);
  CHECK(lines[4].find("lost") != std::string::npos);
  CHECK(lines[5].find("lost") != std::string::npos);
  CHECK(lines[2].find("120/1000") != std::string::npos);
  CHECK(lines[2].find("212 ms") != std::string::npos);
  CHECK(lines[2].find("3.5k") != std::string::npos);
  CHECK(lines[2].find("98%") != std::string::npos);
  CHECK(lines[2].find("300 MiB") != std::string::npos);
  CHECK(lines[4].find("98%") == std::string::npos);  // a lost rank's CPU and RSS are stale
}

TEST_CASE("status table: columns are aligned", "[status_cli]") {
  const auto lines = lines_of(format_status_table(two_nodes()));
  // Left-aligned columns start where their title does; right-aligned ones end there.
  const std::size_t state = column(lines, "STATE");
  const std::size_t rank_end = column(lines, "RANK") + 4;
  const std::size_t rss_end = column(lines, "RSS") + 3;
  for (std::size_t i = 2; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(lines[i].compare(state, 4, i < 4 ? "runn" : "lost") == 0);
    CHECK(lines[i][state - 1] == ' ');
    CHECK(lines[i][rank_end - 1] == static_cast<char>('0' + i - 2));  // global ranks 0..3
    CHECK(lines[i][rank_end] == ' ');
    CHECK(lines[i].substr(rss_end - 1, 1) == (i < 4 ? "B" : "-"));
  }
}

TEST_CASE("status table: GPU absent and present", "[status_cli]") {
  JobStatus job = two_nodes();
  job.nodes[0].ranks[1].gpu = 1;
  job.nodes[0].ranks[1].gpu_util = 0.87;
  job.nodes[0].ranks[1].gpu_mem_used = 3ull << 30;
  job.nodes[0].ranks[1].gpu_mem_total = 80ull << 30;
  const auto lines = lines_of(format_status_table(job));
  const std::size_t gpu = column(lines, "GPU");
  CHECK(lines[2].substr(gpu) == "-");  // gpu -1: none (and no error: the line ends)
  CHECK(lines[3].compare(gpu, 19, "1 87% 3.0/80 GiB") == 0);
  job.nodes[0].ranks[1].gpu_util.reset();
  job.nodes[0].ranks[1].gpu_mem_total.reset();
  CHECK(lines_of(format_status_table(job))[3].find(" 1 3.0 GiB") != std::string::npos);
}

TEST_CASE("status table: long or multi-line errors are cut to one short line", "[status_cli]") {
  JobStatus job = two_nodes();
  auto& r = job.nodes[0].ranks[0];
  r.state = "failed";
  r.last_exit = 1;
  r.last_error = "exitcode 1: " + std::string(200, 'x') + "\nTraceback";
  job.nodes[0].ranks[1].last_error = "signal 9 (SIGKILL)";
  const auto lines = lines_of(format_status_table(job));
  REQUIRE(lines.size() == 6);
  const std::size_t err = column(lines, "LAST ERROR");
  CHECK(lines[2].substr(err) == "exitcode 1: " + std::string(45, 'x') + "...");
  CHECK(lines[3].substr(err) == "signal 9 (SIGKILL)");
  CHECK(lines[2].find("Traceback") == std::string::npos);
  CHECK(lines[2].find("98%") == std::string::npos);  // not alive: CPU "-"
  // Cut on a UTF-8 character, never inside one.
  r.last_error = std::string(56, 'y') + "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9";
  const auto cut = lines_of(format_status_table(job))[2];
  CHECK(cut.substr(cut.size() - 6) == "y\xC3\xA9...");  // 57 characters, then "..."
}

TEST_CASE("status table: a node between rounds and an empty job", "[status_cli]") {
  JobStatus job = two_nodes();
  job.nodes[1].updated_unix = 999;
  job.nodes[1].state = "restarting";
  job.nodes[1].ranks.clear();
  job.nodes[1].restarts.push_back({1, 998, "exitcode", "local rank 1 exited with exitcode 1"});
  ddp::status::fill_derived(job);
  const auto lines = lines_of(format_status_table(job));
  REQUIRE(lines.size() == 5);
  CHECK(lines[4].rfind("beta-long-hostname #1 (restarting)", 0) == 0);
  CHECK(lines[4].find("local rank 1 exited with exitcode 1") != std::string::npos);
  JobStatus empty;
  empty.run_id = "r";
  ddp::status::fill_derived(empty);
  const auto none = lines_of(format_status_table(empty));
  CHECK(none[0] == "run r  state unknown  round -  nodes 0  ranks 0  restarts 0/0");
  CHECK(none.back() == "(no node has published its status yet)");
}

TEST_CASE("status flags: spellings, defaults and values", "[status_cli]") {
  auto o = parse_status_args({"--rdzv-endpoint", "node1"});
  CHECK(o.endpoint.host == "node1");
  CHECK(o.endpoint.port == 29400);
  CHECK(o.run_id.empty());
  CHECK_FALSE(o.watch);
  CHECK_FALSE(o.json);
  CHECK(o.interval_s == 1);
  o = parse_status_args({"--rdzv_endpoint=127.0.0.1:1234", "--rdzv_id", "abc", "--watch",
                         "--interval=0.5", "--json"});
  CHECK(o.endpoint.port == 1234);
  CHECK(o.run_id == "abc");
  CHECK(o.watch);
  CHECK(o.json);
  CHECK(o.interval_s == 0.5);
  CHECK(parse_status_args({"--run-id=x", "--rdzv-endpoint=[::1]:5"}).endpoint.host == "::1");
  CHECK(parse_status_args({"--rdzv-endpoint=h", "--rdzv-id=y"}).run_id == "y");
  CHECK(parse_status_args({"--run_id", "z", "--rdzv-endpoint", "h"}).run_id == "z");
  CHECK(parse_status_args({"--help"}).help);
  CHECK(parse_status_args({"--rdzv-endpoint=h", "-h", "--bogus"}).help);
  CHECK(ddp::launch::status_usage().find("--rdzv-endpoint HOST[:PORT]") != std::string::npos);
}

TEST_CASE("status flags: errors name the flag", "[status_cli]") {
  using Catch::Matchers::Contains;
  auto fails = [](std::vector<std::string> args, const std::string& what) {
    INFO(what);
    CHECK_THROWS_AS(parse_status_args(args), ddp::UsageError);
    CHECK_THROWS_WITH(parse_status_args(args), Contains(what));
  };
  fails({}, "--rdzv-endpoint HOST[:PORT] is required");
  fails({"--run-id", "x"}, "--rdzv-endpoint HOST[:PORT] is required");
  fails({"--rdzv-endpoint"}, "--rdzv-endpoint needs a value");
  fails({"--rdzv-endpoint=h:notaport"}, "--rdzv-endpoint 'h:notaport'");
  fails({"--rdzv-endpoint=h", "--bogus"}, "unknown flag '--bogus'");
  fails({"--rdzv-endpoint=h", "--bogus=1"}, "unknown flag '--bogus'");
  fails({"--rdzv-endpoint=h", "extra"}, "unexpected argument 'extra'");
  fails({"--rdzv-endpoint=h", "--watch=yes"}, "--watch takes no value");
  fails({"--rdzv-endpoint=h", "--json=1"}, "--json takes no value");
  fails({"--rdzv-endpoint=h", "--run-id="}, "--run-id needs a non-empty run id");
  fails({"--rdzv-endpoint=h", "--interval"}, "--interval needs a value");
  for (const char* bad : {"0", "0.05", "3601", "-1", "abc", "1s", "", "nan", "inf"}) {
    fails({"--rdzv-endpoint=h", std::string("--interval=") + bad},
          std::string("--interval '") + bad + "'");
  }
  CHECK(parse_status_args({"--rdzv-endpoint=h", "--interval", "0.1"}).interval_s == 0.1);
  CHECK(parse_status_args({"--rdzv-endpoint=h", "--interval", "3600"}).interval_s == 3600);
}

TEST_CASE("status command: bad flags exit 2, before any connection", "[status_cli]") {
  CHECK(ddp::launch::run_status_command({"--bogus"}) == 2);
  CHECK(ddp::launch::run_status_command({"--rdzv-endpoint=h", "--interval=0"}) == 2);
}

TEST_CASE("status table: nodes in group-rank order, small and large units", "[status_cli]") {
  JobStatus job = two_nodes();
  job.nodes[1].updated_unix = 999;  // not lost: both in round 1, slot 0 is group rank 1
  job.nodes[0].group_rank = 1;
  job.nodes[1].group_rank = 0;
  job.nodes[0].ranks = {rank(0, 2, 7), rank(1, 3, 8)};
  job.nodes[1].ranks = {rank(0, 0, 5), rank(1, 1, 6)};
  job.nodes[1].ranks[0].step_time_s = 2e-5;
  job.nodes[1].ranks[0].samples_per_s = 2.5e6;
  job.nodes[1].ranks[0].rss_bytes = 512;
  job.nodes[1].ranks[1].step_time_s = 125;
  job.nodes[1].ranks[1].samples_per_s = 42.25;
  job.nodes[1].ranks[1].rss_bytes = 5ull << 40;
  ddp::status::fill_derived(job);
  const auto lines = lines_of(format_status_table(job));
  REQUIRE(lines.size() == 6);
  CHECK(lines[2].rfind("beta-long-hostname #1 ", 0) == 0);
  CHECK(lines[4].rfind("alpha #0 ", 0) == 0);
  const std::size_t rank_end = column(lines, "RANK") + 4;
  for (std::size_t i = 2; i < 6; ++i)
    CHECK(lines[i][rank_end - 1] == static_cast<char>('0' + i - 2));
  CHECK(lines[2].find(" 20 us ") != std::string::npos);
  CHECK(lines[2].find(" 2.5M ") != std::string::npos);
  CHECK(lines[2].find(" 512 B ") != std::string::npos);
  CHECK(lines[3].find(" 2m05s ") != std::string::npos);
  CHECK(lines[3].find(" 42.2 ") != std::string::npos);
  CHECK(lines[3].find(" 5.0 TiB ") != std::string::npos);
}

TEST_CASE("status flags: the etcd-v3 backend takes its members and --rdzv-conf", "[status_cli]") {
  using ddp::launch::parse_status_args;
  const auto o = parse_status_args({"--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                                    "e1:2379,e2:2379", "--rdzv-conf=key_prefix=/a,user=u"});
  CHECK(o.backend == "etcd-v3");
  CHECK(o.members == "e1:2379,e2:2379");
  CHECK(o.rdzv_conf.at("key_prefix") == "/a");
  CHECK(o.rdzv_conf.at("user") == "u");
  CHECK(parse_status_args({"--rdzv-endpoint", "h:1"}).backend == "c10d");
  auto refused = [](std::vector<std::string> args, const std::string& says) {
    try {
      parse_status_args(args);
      FAIL("accepted");
    } catch (const ddp::UsageError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains(says));
    }
  };
  refused({"--rdzv-backend", "zookeeper", "--rdzv-endpoint", "h"}, "expected c10d or etcd-v3");
  refused({"--rdzv-backend=etcd-v3", "--rdzv-endpoint", "h", "--rdzv-conf", "novalue"},
          "'novalue' is not KEY=VALUE");
  refused({"--rdzv-endpoint", "h", "--rdzv-conf", "a=b"}, "--rdzv-conf is for");
  refused({"--rdzv-backend=etcd-v3", "--rdzv-endpoint="}, "no etcd member");
}

TEST_CASE("status table: the job line and the metrics column", "[status_cli]") {
  JobStatus job = two_nodes();
  job.nodes[0].ranks[0].metrics = {{"loss", 2.3125}, {"lr", 0.001}};
  job.nodes[0].ranks[1].metrics = {{"loss", 2.5}, {"lr", 0.001}};
  job.nodes[0].started_unix = 900;
  job.nodes[0].phases = {{"rendezvous", 900, 901, ""}, {"restart", 950, 960, ""}};
  ddp::status::fill_derived(job);
  std::istringstream in(format_status_table(job));
  std::string header, line, titles, row;
  std::getline(in, header);
  std::getline(in, line);
  std::getline(in, titles);
  std::getline(in, row);
  // The live node's 2 ranks: step 120 of 1000 at 212 ms a step, 2 x 3450 samples/s; 10 s of
  // 100 lost to the restart; the losses averaged.
  CHECK(line ==
        "job  step 120/1000  6.9k samples/s  ETA 3m06s  goodput 90.0% (lost 10.00 s to "
        "restarts)  loss 2.406 lr 0.001");
  CHECK(titles.find("METRICS") != std::string::npos);
  CHECK(row.find("loss=2.312 lr=0.001") != std::string::npos);
}
