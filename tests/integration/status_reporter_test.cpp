// The agent's StatusReporter against a real store server: its thread publishes one SET per
// interval and nothing else (the store's own counters say so), the loop's hooks reach the
// record readers see (ranks, exits, restarts, phases), /proc figures arrive for a live pid, and
// finish() leaves the final state in the store. Also run under TSan (the hooks and the thread).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>

#include "ddp/launch/status_reporter.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/status/job_view.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace {

// A reporter of run `run_id` publishing every 0.1 s to the store at `port`, no progress line.
launch::StatusSetup setup(const std::string& run_id, std::uint16_t port) {
  launch::StatusSetup ss;
  ss.run_id = run_id;
  ss.host = "testhost";
  ss.max_restarts = 2;
  ss.interval_s = 0.1;
  launch::tcp_status_store(ss, "127.0.0.1", port, {});
  ss.progress = launch::ProgressMode::off;
  return ss;
}

// A store server on an OS-chosen port, one event-loop thread, started.
std::unique_ptr<rdzv::StoreServer> started_server() {
  rdzv::ServerOptions so;
  so.threads = 1;
  auto server = std::make_unique<rdzv::StoreServer>(so);
  server->start();
  return server;
}

}  // namespace

TEST_CASE("status reporter: one SET per interval, hooks in the record, final state at the end",
          "[integration][status]") {
  auto server = started_server();
  launch::StatusReporter rep(setup("rep1", server->port()));
  rep.start();
  rep.phase("rendezvous");
  rep.round_formed(0, 0, 1, 2, 0);
  rep.phase("spawn");
  rep.workers_started({{0, 0, ::getpid(), -1}, {1, 1, ::getpid(), -1}});
  rep.phase("run");

  // Steady state: only the publisher's SETs reach the store, one per interval.
  std::this_thread::sleep_for(300ms);
  const auto before = server->stats();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  const auto after = server->stats();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::uint64_t requests = after.requests - before.requests;
  const std::uint64_t set_count =
      after.requests_by_op[static_cast<std::size_t>(rdzv::OpKind::set)] -
      before.requests_by_op[static_cast<std::size_t>(rdzv::OpKind::set)];
  INFO("requests " << requests << ", sets " << set_count << " in " << elapsed << " s");
  CHECK(requests == set_count);                                // nothing but SETs
  CHECK(set_count >= 3);                                       // it does publish
  CHECK(static_cast<double>(set_count) <= elapsed / 0.1 + 2);  // at most one per interval

  rdzv::StoreClient reader("127.0.0.1", server->port());
  auto job = status::read_job(reader, "rep1", status::unix_now());
  REQUIRE(job.nodes.size() == 1);
  const auto& n = job.nodes[0];
  CHECK(n.host == "testhost");
  CHECK(n.state == "running");
  CHECK(n.world_size == 2);
  CHECK(n.max_restarts == 2);
  REQUIRE(n.ranks.size() == 2);
  CHECK(n.ranks[1].pid == ::getpid());
  CHECK(n.ranks[1].rss_bytes > 0);  // sampled from /proc for a live pid
  REQUIRE(n.phases.size() == 3);
  CHECK(n.phases[2].name == "run");
  CHECK(n.phases[0].end_unix > 0);

  rep.worker_exited(1, -9, "Signal 9 (SIGKILL)", true);
  rep.failure("signal");
  rep.phase("restart", "rank 1 failed");
  rep.restarting(0, "signal", "rank 1 failed");
  rep.workers_stopped();
  rep.finish("failed", 137);
  job = status::read_job(reader, "rep1", status::unix_now());
  REQUIRE(job.nodes.size() == 1);
  const auto& f = job.nodes[0];
  CHECK(f.state == "failed");
  CHECK(f.failures_by_cause.at("signal") == 1);
  REQUIRE(f.restarts.size() == 1);
  CHECK(f.restarts[0].cause == "signal");
  CHECK(f.ranks[1].state == "failed");
  CHECK(f.ranks[1].last_exit == -9);
  CHECK(f.ranks[0].state == "stopped");
  CHECK(job.state == "failed");
  server->stop();
}

TEST_CASE("status reporter: a healed rank's metrics reach its history (its pipe starts over)",
          "[integration][status]") {
  auto server = started_server();
  launch::StatusReporter rep(setup("rep-heal", server->port()));
  rep.start();
  rep.round_formed(0, 0, 1, 1, 0);
  rep.workers_started({{0, 0, ::getpid(), -1}});
  launch::RankProgress before;
  before.reported = true;
  before.step = 5;
  before.metric_lines = 3;
  before.metrics["loss"] = {2.0, 5, 3};
  rep.progress({{0, before}});
  launch::RankProgress healed;  // the replacement's pipe: its first metric line
  healed.reported = true;
  healed.step = 6;
  healed.metric_lines = 1;
  healed.metrics["loss"] = {1.5, 6, 1};
  rep.progress({{0, healed}});
  std::this_thread::sleep_for(400ms);  // a few publications
  const auto n = rep.snapshot();
  REQUIRE(n.history.count("loss") == 1);
  CHECK(n.history.at("loss").back().value == 1.5);
  CHECK(n.history.at("loss").back().step == 6);
  rep.finish("succeeded", 0);
}
