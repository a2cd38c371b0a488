// The lifecycle loop driven by fakes (no processes, no sockets): success; a local failure with
// restarts left, then success; a local failure with none left (exit code and summary); a
// failure elsewhere; a node joining (not counted); stop signals in the rendezvous, the spawn
// and the round; a lost store; a spawn error; a join timeout and a spare. Each scenario checks
// the calls the loop made on its ports, in order, and its exit code.
#include "ddp/launch/lifecycle.hpp"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;

namespace {

using Log = std::vector<std::string>;

Formed round(int number, int restart_count, int members = 2, int group_rank = 0) {
  Formed f;
  f.round.number = number;
  f.round.restart_count = restart_count;
  f.round.group_world_size = members;
  f.round.group_rank = group_rank;
  f.round.base_global_rank = 4 * group_rank;
  f.master_addr = "127.0.0.1";
  f.master_port = 29500;
  return f;
}

RoundEvent remote(RoundEvent::Kind kind, int exit_code = 0) {
  RoundEvent e;
  e.kind = kind;
  e.host = "node-b";
  e.group_rank = 1;
  e.global_rank = 5;
  e.local_rank = 1;
  e.exit_code = exit_code;
  e.what = "exit code 7";
  return e;
}

struct FakeRendezvous : RendezvousPort {
  Log& log;
  std::deque<Formed> rounds;
  std::optional<RoundEvent> held;  // an event another node posted first
  std::string store_gone;          // end_round and finished throw this (the grace passed)
  std::vector<NodeDesc> joined;
  std::vector<RoundEvent> posted;
  explicit FakeRendezvous(Log& l) : log(l) {}

  Formed form(const NodeDesc& self, int hint, int expect) override {
    joined.push_back(self);
    log.push_back("form " + std::to_string(hint) + " expect " + std::to_string(expect) + " rc " +
                  std::to_string(self.restart_count));
    REQUIRE(!rounds.empty());
    Formed f = rounds.front();
    rounds.pop_front();
    return f;
  }
  void finished(const Round& r) override {
    log.push_back("finished " + std::to_string(r.number));
    if (!store_gone.empty()) throw ddp::IoError(store_gone);
  }
  RoundEvent end_round(const Round&, const RoundEvent& e, bool reopen) override {
    log.push_back(std::string("end_round ") + (reopen ? "reopen" : "final"));
    if (!store_gone.empty()) throw ddp::IoError(store_gone);
    posted.push_back(e);
    if (held) return *std::exchange(held, std::nullopt);
    return e;
  }
  void depart(const Round&) override { log.push_back("depart"); }
  std::deque<int> agreements;  // agree_regroup's answers (carrier nodes), in turn (empty: 0)
  int agree_regroup(const Round& r, bool carry) override {
    log.push_back("vote " + std::to_string(r.number) + (carry ? " carry" : " none"));
    if (agreements.empty()) return 0;
    const int a = agreements.front();
    agreements.pop_front();
    return a;
  }
};

struct FakeWorkers : WorkerLauncher {
  Log& log;
  std::deque<SpawnResult> spawns;  // empty: every worker starts
  std::vector<GroupInfo> groups;
  explicit FakeWorkers(Log& l) : log(l) {}

  std::string make_attempt(int rc) override {
    log.push_back("attempt " + std::to_string(rc));
    return "";
  }
  SpawnResult start(const GroupInfo& g) override {
    groups.push_back(g);
    log.push_back("start");
    if (spawns.empty()) return {};
    SpawnResult s = spawns.front();
    spawns.pop_front();
    return s;
  }
  void stop(int sig) override { log.push_back("stop " + std::to_string(sig)); }
  void finish() override { log.push_back("finish"); }
  void remove_temporary_logs() override { log.push_back("remove logs"); }
  void clear() override { log.push_back("clear"); }
  bool regroupable = false;
  bool can_regroup() override { return regroupable; }
  SpawnResult regroup(const GroupInfo& g, std::chrono::system_clock::time_point) override {
    groups.push_back(g);
    log.push_back("regroup");
    return {};
  }
};

struct FakeEvents : EventSource {
  Log& log;
  std::deque<Observation> seen;
  int pending_signal = 0;
  explicit FakeEvents(Log& l) : log(l) {}

  void open(const Round& r) override { log.push_back("watch " + std::to_string(r.number)); }
  int take_signal() override { return std::exchange(pending_signal, 0); }
  Observation wait() override {
    REQUIRE(!seen.empty());  // the loop must not wait past the script
    Observation o = seen.front();
    seen.pop_front();
    return o;
  }
  void unwatch() override { log.push_back("unwatch"); }
};

Observation all_done() {
  Observation o;
  o.all_done = true;
  return o;
}
Observation event(const RoundEvent& e, bool done = false) {
  Observation o;
  o.event = e;
  o.all_done = done;
  return o;
}
Observation worker_failed(int local_rank, int code, int sig = 0) {
  Observation o;
  WorkerExit e;
  e.local_rank = local_rank;
  e.exit_code = code;
  e.signal = sig;
  o.failed.push_back(e);
  return o;
}

// Runs the loop with stderr captured.
struct Run {
  Log log;
  FakeRendezvous rdzv{log};
  FakeWorkers workers{log};
  FakeEvents events{log};
  LifecycleConfig config;
  std::string err;
  Run(int max_restarts = 3) {
    config.self.host = "node-a";
    config.self.pid = 42;
    config.entrypoint = "train.py";
    config.store_where = "10.0.0.1:29400";
    config.nproc = 4;
    config.max_restarts = max_restarts;
    config.max_nodes = 2;
  }
  int operator()() {
    std::fflush(stderr);
    FILE* tmp = std::tmpfile();
    const int saved = ::dup(2);
    ::dup2(::fileno(tmp), 2);
    int rc = -1;
    try {
      rc = run_lifecycle(config, rdzv, workers, events);
    } catch (...) {
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::close(saved);
      std::fclose(tmp);
      throw;
    }
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::rewind(tmp);
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), tmp)) > 0) err.append(buf, n);
    std::fclose(tmp);
    return rc;
  }
};

}  // namespace

TEST_CASE("lifecycle: every node finishes: success", "[unit][launch]") {
  Run run;
  run.rdzv.rounds = {round(0, 0)};
  run.events.seen = {all_done(), event(remote(RoundEvent::Kind::done), true)};
  CHECK(run() == 0);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "finished 0",
                       "finish", "depart", "remove logs"});
  REQUIRE(run.workers.groups.size() == 1);
  CHECK(run.workers.groups[0].master_port == 29500);
  CHECK(run.workers.groups[0].local_world_size == 4);
}

TEST_CASE("lifecycle: solo: the local workers' success is the job's", "[unit][launch]") {
  Run run;
  run.config.solo = true;
  run.rdzv.rounds = {round(0, 0, 1)};
  run.events.seen = {all_done()};
  CHECK(run() == 0);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "finished 0",
                       "finish", "depart", "remove logs"});
}

TEST_CASE("lifecycle: a local failure with restarts left, then success", "[unit][launch]") {
  Run run;
  run.rdzv.rounds = {round(0, 0, 2, 1), round(1, 1, 2, 1)};
  run.events.seen = {Observation{}, worker_failed(2, 3), event(remote(RoundEvent::Kind::done))};
  CHECK(run() == 0);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "stop 15",
                       "end_round reopen", "clear", "unwatch", "form 1 expect 2 rc 1", "attempt 1",
                       "watch 1", "start", "finish", "depart", "remove logs"});
  REQUIRE(run.rdzv.posted.size() == 1);
  const RoundEvent& ours = run.rdzv.posted[0];
  CHECK(ours.kind == RoundEvent::Kind::failure);
  CHECK(ours.host == "node-a");
  CHECK(ours.group_rank == 1);
  CHECK(ours.local_rank == 2);
  CHECK(ours.global_rank == 6);
  CHECK(ours.exit_code == 3);
  CHECK(run.rdzv.joined[1].restart_count == 1);
  CHECK(run.rdzv.joined[1].prev_group_rank == 1);
  CHECK(run.err.find("restarting the workers of every node, restart 1 of 3") != std::string::npos);
}

TEST_CASE("lifecycle: a local failure with no restarts left: its code and the summary",
          "[unit][launch]") {
  Run run(0);
  run.rdzv.rounds = {round(0, 0)};
  run.events.seen = {worker_failed(1, 0, SIGKILL)};
  CHECK(run() == 128 + SIGKILL);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "stop 15",
                       "end_round final", "depart"});
  CHECK(run.err.find("train.py FAILED") != std::string::npos);
  CHECK(run.err.find("Signal 9 (SIGKILL)") != std::string::npos);
}

TEST_CASE("lifecycle: a failure elsewhere restarts every node, or stops it", "[unit][launch]") {
  SECTION("restarts left: counted") {
    Run run;
    run.rdzv.rounds = {round(0, 0), round(1, 1)};
    run.events.seen = {event(remote(RoundEvent::Kind::failure, 7)),
                       event(remote(RoundEvent::Kind::done), true)};
    CHECK(run() == 0);
    CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "stop 15",
                         "clear", "unwatch", "form 1 expect 2 rc 1", "attempt 1", "watch 1",
                         "start", "finished 1", "finish", "depart", "remove logs"});
    CHECK(run.rdzv.posted.empty());
  }
  SECTION("no restarts left: the failed node's code") {
    Run run(1);
    run.rdzv.rounds = {round(0, 1)};
    run.events.seen = {event(remote(RoundEvent::Kind::failure, 7))};
    CHECK(run() == 7);
    CHECK(run.log ==
          Log{"form -1 expect 0 rc 0", "attempt 1", "watch 0", "start", "stop 15", "depart"});
    CHECK(run.err.find("stopping: rank 5 (local_rank 1) on node-b") != std::string::npos);
    CHECK(run.err.find("no restarts left (--max-restarts=1)") != std::string::npos);
  }
  SECTION("our failure loses the race to another's: restart, counted once") {
    Run run;
    run.rdzv.rounds = {round(0, 0), round(1, 1)};
    run.rdzv.held = remote(RoundEvent::Kind::failure, 7);
    run.events.seen = {worker_failed(0, 3), event(remote(RoundEvent::Kind::done), true)};
    CHECK(run() == 0);
    CHECK(run.rdzv.joined[1].restart_count == 1);
  }
}

TEST_CASE("lifecycle: a node that joins or is lost re-forms without counting", "[unit][launch]") {
  Run run;
  run.rdzv.rounds = {round(0, 2), round(1, 2, 1)};
  run.events.seen = {event(remote(RoundEvent::Kind::lost)),
                     event(remote(RoundEvent::Kind::done), true)};
  CHECK(run() == 0);
  CHECK(run.log[7] == "form 1 expect 1 rc 2");
  CHECK(run.err.find("re-forming the job (not counted as a restart)") != std::string::npos);
}

TEST_CASE("lifecycle: a stop signal in every phase gives 128 + signal", "[unit][launch]") {
  SECTION("while running: the workers get it, the round ends with it") {
    Run run;
    run.rdzv.rounds = {round(0, 0)};
    Observation sig;
    sig.stop_signal = SIGTERM;
    run.events.seen = {all_done(), sig};
    CHECK(run() == 128 + SIGTERM);
    CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "finished 0",
                         "stop 15", "end_round reopen"});
    REQUIRE(run.rdzv.posted.size() == 1);
    CHECK(run.rdzv.posted[0].kind == RoundEvent::Kind::signal);
    CHECK(run.rdzv.posted[0].signal == SIGTERM);
  }
  SECTION("while spawning") {
    Run run;
    run.rdzv.rounds = {round(0, 0)};
    SpawnResult s;
    s.stop_signal = true;
    run.workers.spawns = {s};
    run.events.pending_signal = SIGINT;
    CHECK(run() == 128 + SIGINT);
    CHECK(run.log.back() == "end_round reopen");
    CHECK(run.log[run.log.size() - 2] == "stop 2");
  }
  SECTION("in the rendezvous: nothing to stop") {
    Run run;
    Formed f;
    f.signal = SIGTERM;
    run.rdzv.rounds = {f};
    CHECK(run() == 128 + SIGTERM);
    CHECK(run.log == Log{"form -1 expect 0 rc 0"});
    CHECK(run.err.find("during the rendezvous; stopping") != std::string::npos);
  }
}

TEST_CASE("lifecycle: a lost store stops the workers and exits 1", "[unit][launch]") {
  Run run;
  run.rdzv.rounds = {round(0, 0)};
  Observation o;
  o.store_lost = true;
  o.store_error = "connection reset";
  run.events.seen = {o};
  CHECK(run() == 1);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "stop 15"});
  CHECK(run.err.find("lost the rendezvous store at 10.0.0.1:29400 (connection reset)") !=
        std::string::npos);
}

TEST_CASE("lifecycle: a failure that cannot be posted within the grace: summary, then the store",
          "[unit][launch]") {
  Run run;
  run.rdzv.rounds = {round(0, 0, 2, 1)};
  run.rdzv.store_gone = "unreachable for 5 min 0 s, longer than --store-outage-grace=5 min 0 s";
  run.events.seen = {worker_failed(2, 3)};
  CHECK(run() == 1);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "stop 15",
                       "end_round reopen"});
  CHECK(run.err.find("FAILED") != std::string::npos);  // this node's failure summary
  CHECK(run.err.find("lost the rendezvous store at 10.0.0.1:29400 (unreachable for 5 min") !=
        std::string::npos);
}

TEST_CASE("lifecycle: a finish that cannot be posted within the grace stops the node",
          "[unit][launch]") {
  Run run;
  run.rdzv.rounds = {round(0, 0, 2, 0)};
  run.rdzv.store_gone = "unreachable";
  Observation done;
  done.all_done = true;
  run.events.seen = {done};
  CHECK(run() == 1);
  CHECK(run.log.back() == "stop 15");
  CHECK(run.err.find("lost the rendezvous store at 10.0.0.1:29400 (unreachable)") !=
        std::string::npos);
}

TEST_CASE("lifecycle: a log directory that cannot be made fails the node", "[unit][launch]") {
  Run run(0);
  run.rdzv.rounds = {round(0, 0)};
  SpawnResult s;
  s.error = "cannot create the log directory /x/1: No space left on device";
  s.rank = 1;
  run.workers.spawns = {s};
  CHECK(run() == 1);
  CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "start", "stop 15",
                       "end_round final", "depart"});
  REQUIRE(run.rdzv.posted.size() == 1);
  CHECK(run.rdzv.posted[0].local_rank == 1);
  CHECK(run.err.find("No space left on device; stopping the job") != std::string::npos);
}

TEST_CASE("lifecycle: a join timeout exits 1, a spare whose job finished exits 0",
          "[unit][launch]") {
  Run timeout;
  Formed t;
  t.kind = Formation::timed_out;
  t.message = "only 1 of at least 2 nodes joined";
  timeout.rdzv.rounds = {t};
  CHECK(timeout() == 1);
  CHECK(timeout.err.find("only 1 of at least 2 nodes joined") != std::string::npos);

  Run spare;
  Formed s;
  s.kind = Formation::spare_not_needed;
  spare.rdzv.rounds = {s};
  CHECK(spare() == 0);
  CHECK(spare.err.find("waited as a spare") != std::string::npos);
}

TEST_CASE("lifecycle: an elastic job regroups around workers that can, and only then",
          "[unit][launch]") {
  SECTION("a node lost: the workers keep running, are told their places, nothing restarts") {
    Run run;
    run.config.elastic = true;
    run.workers.regroupable = true;
    run.rdzv.rounds = {round(0, 1, 3, 1), round(1, 1, 2, 0)};
    run.rdzv.agreements = {0, 2};  // the first round: nobody carries; then both nodes do
    run.events.seen = {event(remote(RoundEvent::Kind::lost)),
                       event(remote(RoundEvent::Kind::done), true)};
    CHECK(run() == 0);
    CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 1", "watch 0", "vote 0 none", "start",
                         "unwatch", "form 1 expect 2 rc 1", "attempt 1", "watch 1", "vote 1 carry",
                         "regroup", "finished 1", "finish", "depart", "remove logs"});
    REQUIRE(run.workers.groups.size() == 2);
    CHECK(run.workers.groups[0].join_round == -1);
    CHECK(run.workers.groups[1].join_round == 1);  // a replacement joins the regrouped group
    CHECK(run.workers.groups[1].base_global_rank == 0);
    CHECK(run.workers.groups[1].joining_ranks == 0);  // both nodes carry their workers
    CHECK(run.err.find("the workers keep running (regrouping)") != std::string::npos);
    CHECK(run.err.find("regrouped around its running workers: 2 nodes") != std::string::npos);
  }
  SECTION("the others did not agree: the carried workers stop and start anew") {
    Run run;
    run.config.elastic = true;
    run.workers.regroupable = true;
    run.rdzv.rounds = {round(0, 0), round(1, 0)};
    run.events.seen = {event(remote(RoundEvent::Kind::join)),
                       event(remote(RoundEvent::Kind::done), true)};
    CHECK(run() == 0);
    CHECK(run.log == Log{"form -1 expect 0 rc 0", "attempt 0", "watch 0", "vote 0 none", "start",
                         "unwatch", "form 1 expect 2 rc 0", "attempt 0", "watch 1", "vote 1 carry",
                         "stop 15", "clear", "start", "finished 1", "finish", "depart",
                         "remove logs"});
  }
  SECTION("a node with no workers joins a group that regroups: its workers join it") {
    Run run;
    run.config.elastic = true;
    run.rdzv.rounds = {round(4, 0, 3)};
    run.rdzv.rounds.front().round.world_size = 12;
    run.rdzv.agreements = {2};  // two nodes carry 8 ranks: this one's 4 join them
    run.events.seen = {event(remote(RoundEvent::Kind::done), true)};
    CHECK(run() == 0);
    REQUIRE(run.workers.groups.size() == 1);
    CHECK(run.workers.groups[0].join_round == 4);
    CHECK(run.workers.groups[0].joining_ranks == 4);
    CHECK(run.log[4] == "start");
  }
  SECTION("workers that cannot regroup, or a job that is not elastic: stopped as before") {
    for (const bool elastic : {true, false}) {
      Run run;
      run.config.elastic = elastic;
      run.workers.regroupable = !elastic;
      run.rdzv.rounds = {round(0, 0), round(1, 0, 1)};
      run.events.seen = {event(remote(RoundEvent::Kind::lost)),
                         event(remote(RoundEvent::Kind::done), true)};
      CHECK(run() == 0);
      CHECK(std::find(run.log.begin(), run.log.end(), "stop 15") != run.log.end());
      CHECK(std::find(run.log.begin(), run.log.end(), "regroup") == run.log.end());
      const bool voted = std::find(run.log.begin(), run.log.end(), "vote 1 none") != run.log.end();
      CHECK(voted == elastic);
    }
  }
}
