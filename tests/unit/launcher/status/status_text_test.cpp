// Tests of status_text.hpp on hand-made records: durations, the progress line (slowest rank's
// step, total, samples/s summed, median step time, ETA; nothing before any progress) and the
// exit summary (wall time, state and exit code, restarts and causes, per-rank exits, slowest).
#include "ddp/launch/status_text.hpp"

#include <catch2/catch.hpp>
#include <string>

using namespace ddp::launch;
using ddp::status::JobStatus;
using ddp::status::NodeStatus;
using ddp::status::RankStatus;

namespace {

RankStatus rank(int local, int global, std::int64_t step, double step_s, double sps,
                std::int64_t total) {
  RankStatus r;
  r.local_rank = local;
  r.rank = global;
  r.state = "running";
  r.step = step;
  r.step_time_s = step_s;
  r.samples_per_s = sps;
  r.total_steps = total;
  return r;
}

}  // namespace

TEST_CASE("status text: durations", "[unit][launch][status_text]") {
  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(-3) == "0s");
  CHECK(format_duration(42.4) == "42s");
  CHECK(format_duration(184) == "3m04s");
  CHECK(format_duration(3600 + 125) == "1h02m");
  CHECK(format_duration(100 * 3600) == "100h00m");
}

TEST_CASE("status text: the progress line", "[unit][launch][status_text]") {
  NodeStatus n;
  CHECK(format_progress_line(n).empty());  // no ranks
  n.ranks = {rank(0, 0, -1, 0, 0, -1), rank(1, 1, -1, 0, 0, -1)};
  CHECK(format_progress_line(n).empty());  // nothing reported yet
  // The slowest rank's step, samples/s summed, the median step time, the ETA.
  n.ranks = {rank(0, 0, 121, 0.20, 1500, 1000), rank(1, 1, 120, 0.21, 1450, 1000),
             rank(2, 2, 125, 0.22, 500, 1000)};
  CHECK(format_progress_line(n) ==
        "ddprun: step 120/1000 | 3450 samples/s | step 0.21 s | ETA 3m05s");
  // Unknown total: no ETA; unknown samples: no rate.
  n.ranks = {rank(0, 0, 7, 0.5, 0, -1), rank(1, 1, 9, 1.5, 0, -1)};
  CHECK(format_progress_line(n) == "ddprun: step 7 | step 1 s");
  // Only a step so far.
  n.ranks = {rank(0, 0, 0, 0, 0, 50)};
  CHECK(format_progress_line(n) == "ddprun: step 0/50");
  // Past the total: the ETA does not go negative; slow steps read in hours.
  n.ranks = {rank(0, 0, 60, 2.0, 3.5, 50)};
  CHECK(format_progress_line(n) == "ddprun: step 60/50 | 3.5 samples/s | step 2 s | ETA 0s");
  n.ranks = {rank(0, 0, 0, 12.5, 0, 301)};
  CHECK(format_progress_line(n) == "ddprun: step 0/301 | step 12 s | ETA 1h02m");
}

TEST_CASE("status text: the exit summary", "[unit][launch][status_text]") {
  JobStatus job;
  job.run_id = "r1";
  job.state = "succeeded";
  job.restarts = 1;
  NodeStatus a;
  a.host = "alpha";
  a.slot = 0;
  a.restart_count = 1;
  a.ranks = {rank(0, 0, 99, 0.10, 0, 100), rank(1, 1, 99, 0.30, 0, 100)};
  for (auto& r : a.ranks) {
    r.state = "succeeded";
    r.last_exit = 0;
    r.restarts = 1;
  }
  a.restarts = {{0, 1700000010, "signal", "local rank 1 (rank 1) died of signal 9 (SIGKILL)"}};
  a.failures_by_cause = {{"signal", 1}};
  NodeStatus b = a;
  b.host = "beta";
  b.slot = 1;
  b.ranks[0].rank = 2;
  b.ranks[1].rank = 3;
  b.ranks[0].step_time_s = 0.12;
  b.ranks[1].step_time_s = 0.11;
  b.restarts = {{0, 1700000010.5, "signal", "local rank 1 (rank 1) died of signal 9 (SIGKILL)"}};
  b.ranks[1].state = "failed";
  b.ranks[1].last_exit = 2;
  b.ranks[1].last_error = "exit code 2";  // WorkerExit::in_words()
  job.nodes = {a, b};
  const std::string s = format_exit_summary(job, 125.25, 1);
  INFO(s);
  CHECK(s.rfind("ddprun: summary of run r1\n", 0) == 0);
  CHECK_THAT(s, Catch::Contains("wall time    2m05s (125.2 s)") ||
                    Catch::Contains("wall time    2m05s (125.3 s)"));
  CHECK_THAT(s, Catch::Contains("final state  failed, exit code 1 (job succeeded)"));
  CHECK_THAT(s, Catch::Contains("nodes        2, ranks 4"));
  CHECK_THAT(s, Catch::Contains("restarts     1 (failures: 1 killed by a signal)"));
  // The same restart told by both nodes is listed once.
  const std::string event =
      "round 0: killed by a signal: local rank 1 (rank 1) died of signal 9 (SIGKILL) [node alpha "
      "(slot 0)]";
  CHECK_THAT(s, Catch::Contains(event));
  CHECK(s.find("died of signal 9", s.find(event) + event.size()) == std::string::npos);
  // One row per rank, by global rank.
  CHECK_THAT(s, Catch::Contains("  rank  node            local  state      restarts  step  exit  "
                                "last error\n"));
  CHECK_THAT(s, Catch::Contains("  0     alpha (slot 0)  0      succeeded  1         99    0     "
                                "-\n"));
  CHECK_THAT(s, Catch::Contains("  3     beta (slot 1)   1      failed     1         99    2     "
                                "exit code 2\n"));
  CHECK(s.find("  1     alpha") < s.find("  2     beta"));
  CHECK_THAT(s, Catch::Contains("slowest rank: rank 1 on alpha (slot 0), local 1: step 0.3 s "
                                "(median of all ranks 0.115 s)"));
  CHECK(s.back() == '\n');
}

TEST_CASE("status text: failures are counted in words, never read as an exit code",
          "[unit][launch][status_text]") {
  JobStatus job;
  NodeStatus n;
  n.host = "h";
  n.ranks = {rank(0, 0, -1, 0, 0, -1)};
  n.restarts = {{0, 1700000010.5, "exitcode", "rank 0 failed: exit code 2"},
                {1, 1700000020.5, "exitcode", "rank 0 failed: exit code 2"},
                {2, 1700000030.5, "hang", "rank 0 made no progress"},
                {3, 1700000040.5, "oom", "rank 0: Signal 9 (SIGKILL), the OOM killer"}};
  job.nodes = {n};
  const std::string s = format_exit_summary(job, 3.04, 1);
  INFO(s);
  CHECK_THAT(s, Catch::Contains("(failures: 2 non-zero exits, 1 hang, 1 out of memory)"));
  CHECK(s.find("exitcode") == std::string::npos);
}

TEST_CASE("status text: a summary with little to tell", "[unit][launch][status_text]") {
  JobStatus job;
  NodeStatus n;
  n.host = "h";
  n.lost = true;
  n.ranks = {rank(0, 0, -1, 0, 0, -1)};
  job.nodes = {n};
  const std::string s = format_exit_summary(job, 3.04, 0);
  INFO(s);
  CHECK(s.rfind("ddprun: summary\n", 0) == 0);
  CHECK_THAT(s, Catch::Contains("wall time    3.0 s\n"));
  CHECK_THAT(s, Catch::Contains("final state  succeeded, exit code 0\n"));
  CHECK_THAT(s, Catch::Contains("restarts     0\n"));
  CHECK_THAT(s, Catch::Contains("  0     h (slot 0)  0      lost   0         -     -     -\n"));
  CHECK(s.find("slowest") == std::string::npos);  // no step times known
  // No nodes at all: still the head.
  const std::string e = format_exit_summary(JobStatus{}, 0, 2);
  CHECK_THAT(e, Catch::Contains("final state  failed, exit code 2"));
  CHECK_THAT(e, Catch::Contains("nodes        0, ranks 0"));
}

TEST_CASE("status text: a big job lists the ranks that did not succeed",
          "[unit][launch][status_text]") {
  JobStatus job;
  NodeStatus n;
  n.host = "h";
  for (int i = 0; i < 100; ++i) {
    RankStatus r = rank(i, i, 10, 0, 0, -1);
    r.state = i == 42 ? "failed" : "succeeded";
    n.ranks.push_back(r);
  }
  job.nodes = {n};
  const std::string s = format_exit_summary(job, 1, 1);
  INFO(s);
  CHECK_THAT(s, Catch::Contains("  42    h (slot 0)  42     failed"));
  CHECK(s.find("succeeded  0") == std::string::npos);
  CHECK_THAT(s, Catch::Contains("... and more ranks: succeeded 99"));
}
