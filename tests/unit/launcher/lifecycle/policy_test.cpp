// The round-outcome policy as a table: each row is a set of facts (formation, stop signal,
// local failures, spawn error, hang, local workers done, solo, the round's event, posted,
// store lost, restarts left) and the one decision it must give; then every combination of
// those inputs against the rules' invariants, and the failure event a node posts.
#include "ddp/launch/policy.hpp"

#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

using namespace ddp::launch;
using Kind = Decision::Kind;

namespace {

Failure worker_failure(int local_rank, int code, int sig = 0, int at_s = 0) {
  Failure f;
  f.exit.local_rank = local_rank;
  f.exit.exit_code = code;
  f.exit.signal = sig;
  f.exit.when = std::chrono::system_clock::time_point(std::chrono::seconds(1000 + at_s));
  f.global_rank = 8 + local_rank;
  f.host = "here";
  return f;
}

RoundEvent event(RoundEvent::Kind kind, int exit_code = 0) {
  RoundEvent e;
  e.kind = kind;
  e.host = "there";
  e.exit_code = exit_code;
  return e;
}

// Facts, built one input at a time: a round of 3 nodes (MAX 4), restart 0 of 2.
struct F {
  RoundFacts f;
  F() {
    f.members = 3;
    f.max_nodes = 4;
    f.max_restarts = 2;
  }
  F& formation(Formation v) { return f.formation = v, *this; }
  F& sig(int s) { return f.stop_signal = s, *this; }
  F& fail(int code, int s = 0, int at = 0) {
    f.failures.push_back(worker_failure(static_cast<int>(f.failures.size()), code, s, at));
    return *this;
  }
  F& spawn() { return f.spawn_error = "cannot create /logs/0", f.spawn_rank = 0, *this; }
  F& hang() {
    HangReport h;
    h.local_rank = 1;
    h.silent = std::chrono::seconds(60);
    f.hang = h;
    return *this;
  }
  F& done() { return f.local_done = true, *this; }
  F& solo() { return f.solo = true, f.members = 1, f.max_nodes = 1, *this; }
  F& ev(RoundEvent::Kind k, int code = 0) { return f.event = event(k, code), *this; }
  F& posted() { return f.posted = true, *this; }
  F& lost() { return f.store_lost = true, *this; }
  F& last() { return f.restart_count = 2, *this; }  // no restarts left
};

struct Expect {
  Kind kind;
  int exit_code = 0;
  Report report = Report::none;
  bool leave = false;
  int next_restart_count = 0;
  int next_expect = 0;
};

struct Row {
  const char* name;
  RoundFacts facts;
  Expect want;
};

Expect stop(int code, Report r, bool leave) { return {Kind::stop_and_report, code, r, leave}; }
Expect next(Kind k, int rc, int expect) { return {k, 0, Report::none, false, rc, expect}; }

using K = RoundEvent::Kind;
const Report kLocal = Report::local_summary;
const Report kRemote = Report::remote_failure;

std::vector<Row> table() {
  return {
      // The rendezvous did not form a round.
      {"join timeout", F().formation(Formation::timed_out).f,
       stop(1, Report::rendezvous_timeout, false)},
      {"spare, job done", F().formation(Formation::spare_not_needed).f,
       stop(0, Report::spare_not_needed, false)},
      {"signal during the rendezvous", F().sig(15).f, {Kind::exit_on_signal, 143}},
      {"SIGINT during the rendezvous", F().sig(2).f, {Kind::exit_on_signal, 130}},
      // Nothing yet.
      {"nothing happened", F().f, {Kind::keep_waiting}},
      {"local workers done, others still run", F().done().f, {Kind::keep_waiting}},
      {"local workers done, last restart", F().done().last().f, {Kind::keep_waiting}},
      // A stop signal wins over everything else seen in the same turn.
      {"signal", F().sig(15).f, {Kind::exit_on_signal, 143}},
      {"signal + local failure", F().sig(15).fail(3).f, {Kind::exit_on_signal, 143}},
      {"signal + spawn error", F().sig(15).spawn().f, {Kind::exit_on_signal, 143}},
      {"signal + remote failure", F().sig(2).ev(K::failure, 7).f, {Kind::exit_on_signal, 130}},
      {"signal + done", F().sig(15).done().ev(K::done).f, {Kind::exit_on_signal, 143}},
      {"signal + store lost", F().sig(15).lost().f, {Kind::exit_on_signal, 143}},
      {"signal, no restarts left", F().sig(15).last().f, {Kind::exit_on_signal, 143}},
      {"signal, solo", F().solo().sig(15).done().f, {Kind::exit_on_signal, 143}},
      // A local failure is posted first, whatever else came in the same turn.
      {"worker exit code", F().fail(3).f, {Kind::post_failure}},
      {"worker killed by a signal", F().fail(0, 9).f, {Kind::post_failure}},
      {"two workers failed", F().fail(3).fail(4).f, {Kind::post_failure}},
      {"worker failure, no restarts left", F().fail(3).last().f, {Kind::post_failure}},
      {"worker failure + remote failure", F().fail(3).ev(K::failure, 7).f, {Kind::post_failure}},
      {"worker failure + store lost", F().fail(3).lost().f, {Kind::post_failure}},
      {"worker failure, solo", F().solo().fail(3).f, {Kind::post_failure}},
      {"spawn error", F().spawn().f, {Kind::post_failure}},
      {"spawn error, no restarts left", F().spawn().last().f, {Kind::post_failure}},
      {"hang (reserved)", F().hang().f, {Kind::post_failure}},
      {"hang + done event", F().hang().ev(K::done).f, {Kind::post_failure}},
      // After posting: no restarts left stops with the local root cause.
      {"posted, ours held, last", F().fail(3).posted().ev(K::failure, 3).last().f,
       stop(3, kLocal, true)},
      {"posted, signal exit, last", F().fail(0, 9).posted().ev(K::failure, 137).last().f,
       stop(137, kLocal, true)},
      {"posted, root cause is the earliest", F().fail(4, 0, 5).fail(6, 0, 1).posted().last().f,
       stop(6, kLocal, true)},
      {"posted, another's failure held, last", F().fail(3).posted().ev(K::failure, 7).last().f,
       stop(3, kLocal, true)},
      {"posted, a lost node held, last", F().fail(3).posted().ev(K::lost).last().f,
       stop(3, kLocal, true)},
      {"posted spawn error, last", F().spawn().posted().ev(K::failure, 1).last().f,
       stop(1, Report::none, true)},
      {"posted hang, last", F().hang().posted().ev(K::failure, 1).last().f,
       stop(kHangExitCode, Report::hang, true)},
      // After posting with restarts left: the event that held decides.
      {"posted, ours held", F().fail(3).posted().ev(K::failure, 3).f,
       next(Kind::restart_all, 1, 3)},
      {"posted, another's failure held", F().fail(3).posted().ev(K::failure, 7).f,
       next(Kind::restart_all, 1, 3)},
      {"posted, a signal elsewhere held", F().fail(3).posted().ev(K::signal).f,
       next(Kind::reform, 0, 2)},
      {"posted, a lost node held", F().fail(3).posted().ev(K::lost).f, next(Kind::reform, 0, 2)},
      {"posted, a join held", F().fail(3).posted().ev(K::join).f, next(Kind::reform, 0, 4)},
      {"posted spawn error, ours held", F().spawn().posted().ev(K::failure, 1).f,
       next(Kind::restart_all, 1, 3)},
      {"posted, solo", F().solo().fail(3).posted().ev(K::failure, 3).f,
       next(Kind::restart_all, 1, 1)},
      // Solo: no event to wait for.
      {"solo, all done", F().solo().done().f, {Kind::succeed, 0, Report::none, true}},
      {"solo, nothing yet", F().solo().f, {Kind::keep_waiting}},
      // The round's event, posted by another node (or by our own "finished").
      {"done", F().done().ev(K::done).f, {Kind::succeed, 0, Report::none, true}},
      {"done, last restart",
       F().done().ev(K::done).last().f,
       {Kind::succeed, 0, Report::none, true}},
      {"done before our workers finished",
       F().ev(K::done).f,
       {Kind::succeed, 0, Report::none, true}},
      {"remote failure", F().ev(K::failure, 7).f, next(Kind::restart_all, 1, 3)},
      {"remote failure after our workers finished", F().done().ev(K::failure, 7).f,
       next(Kind::restart_all, 1, 3)},
      {"remote failure, no restarts left", F().ev(K::failure, 7).last().f, stop(7, kRemote, true)},
      {"remote failure without a code, last", F().ev(K::failure, 0).last().f,
       stop(1, kRemote, true)},
      {"remote signal", F().ev(K::signal).f, next(Kind::reform, 0, 2)},
      {"remote signal, no restarts left", F().ev(K::signal).last().f, next(Kind::reform, 2, 2)},
      {"node lost", F().ev(K::lost).f, next(Kind::reform, 0, 2)},
      {"node lost, no restarts left", F().ev(K::lost).last().f, next(Kind::reform, 2, 2)},
      {"node joins", F().ev(K::join).f, next(Kind::reform, 0, 4)},
      {"node joins after our workers finished", F().done().ev(K::join).f, next(Kind::reform, 0, 4)},
      // The store.
      {"store lost", F().lost().f, stop(1, Report::store_lost, false)},
      {"store lost after our workers finished", F().done().lost().f,
       stop(1, Report::store_lost, false)},
      {"store lost, no restarts left", F().lost().last().f, stop(1, Report::store_lost, false)},
  };
}

}  // namespace

TEST_CASE("the policy table: each row's facts give its decision", "[unit][launch]") {
  for (const Row& row : table()) {
    INFO(row.name);
    const Decision d = decide(row.facts);
    CHECK(d.kind == row.want.kind);
    CHECK(d.exit_code == row.want.exit_code);
    CHECK(d.report == row.want.report);
    CHECK(d.leave == row.want.leave);
    if (d.kind == Kind::restart_all || d.kind == Kind::reform) {
      CHECK(d.next_restart_count == row.want.next_restart_count);
      CHECK(d.next_expect == row.want.next_expect);
    }
  }
}

TEST_CASE("a join at MAX nodes expects no more than MAX", "[unit][launch]") {
  RoundFacts f = F().ev(K::join).f;
  f.members = 4;
  const Decision d = decide(f);
  CHECK(d.kind == Kind::reform);
  CHECK(d.next_expect == 4);
}

// Every combination of the inputs: the rules' invariants hold for each.
TEST_CASE("every combination of the inputs keeps the policy's invariants", "[unit][launch]") {
  const std::vector<std::optional<K>> events = {std::nullopt, K::done, K::failure,
                                                K::signal,    K::join, K::lost};
  int combos = 0;
  for (int formation = 0; formation < 3; ++formation)
    for (int sig : {0, 15})
      for (int local = 0; local < 4; ++local)  // none, worker, spawn error, hang
        for (bool done : {false, true})
          for (bool solo : {false, true})
            for (const auto& ev : events)
              for (bool posted : {false, true})
                for (bool lost : {false, true})
                  for (bool last : {false, true}) {
                    F b;
                    b.formation(static_cast<Formation>(formation)).sig(sig);
                    if (local == 1) b.fail(3);
                    if (local == 2) b.spawn();
                    if (local == 3) b.hang();
                    if (done) b.done();
                    if (solo) b.solo();
                    if (ev) b.ev(*ev, *ev == K::failure ? 7 : 0);
                    if (posted) b.posted();
                    if (lost) b.lost();
                    if (last) b.last();
                    const RoundFacts& f = b.f;
                    const Decision d = decide(f);
                    ++combos;
                    if (f.formation != Formation::formed) {
                      CHECK(d.kind == Kind::stop_and_report);
                      CHECK_FALSE(d.leave);
                      continue;
                    }
                    if (sig != 0) {
                      CHECK(d.kind == Kind::exit_on_signal);
                      CHECK(d.exit_code == 128 + sig);
                      continue;
                    }
                    if (d.kind == Kind::keep_waiting) {
                      CHECK_FALSE(f.local_failure());
                      CHECK_FALSE(f.event);
                      CHECK_FALSE(f.store_lost);
                      CHECK_FALSE((f.solo && f.local_done));
                    }
                    if (d.kind == Kind::post_failure) {
                      CHECK(f.local_failure());
                      CHECK_FALSE(f.posted);
                    }
                    if (d.kind == Kind::restart_all) {
                      CHECK(f.restarts_left());  // only failures count, and only when left
                      CHECK(d.next_restart_count == f.restart_count + 1);
                    }
                    if (d.kind == Kind::reform) CHECK(d.next_restart_count == f.restart_count);
                    if (d.kind == Kind::succeed) CHECK(d.exit_code == 0);
                    if (d.kind == Kind::stop_and_report) {
                      CHECK(d.exit_code != 0);  // a failure never exits 0
                      CHECK(d.leave == (d.report != Report::store_lost));
                    }
                    if (f.posted && !f.restarts_left()) CHECK(d.kind == Kind::stop_and_report);
                    if (!f.posted && f.local_failure()) CHECK(d.kind == Kind::post_failure);
                  }
  CHECK(combos == 3 * 2 * 4 * 2 * 2 * 6 * 2 * 2 * 2);
}

TEST_CASE("the failure a node posts names its root cause", "[unit][launch]") {
  RoundFacts f = F().fail(4, 0, 5).fail(0, 11, 1).f;
  const RoundEvent e = failure_event(f, "gpu-3", 2, 8);
  CHECK(e.kind == RoundEvent::Kind::failure);
  CHECK(e.host == "gpu-3");
  CHECK(e.group_rank == 2);
  CHECK(e.local_rank == 1);  // the earlier one, SIGSEGV
  CHECK(e.global_rank == 9);
  CHECK(e.exit_code == 128 + 11);
  CHECK(e.what == "Signal 11 (SIGSEGV)");
  CHECK(f.failures.front().exit.local_rank == 1);  // sorted by time

  RoundFacts g = F().fail(3).f;
  CHECK(failure_event(g, "h", 0, 0).what == "exit code 3");

  RoundFacts s = F().spawn().f;
  s.spawn_rank = 2;
  const RoundEvent se = failure_event(s, "h", 1, 4);
  CHECK(se.exit_code == 1);
  CHECK(se.local_rank == 2);
  CHECK(se.global_rank == 6);
  CHECK(se.what == "its log directory or file could not be created");

  RoundFacts h = F().hang().f;
  const RoundEvent he = failure_event(h, "h", 0, 4);
  CHECK(he.exit_code == kHangExitCode);
  CHECK(he.global_rank == 5);
  CHECK(he.what == "it stopped making progress");
  CHECK_FALSE(he.final);
  // --on-hang=stop: the event ends the job on every node, restarts left or not.
  RoundFacts stop = F().hang().f;
  stop.hang->stop_job = true;
  stop.hang->rank = 9;
  stop.hang->what = "rank 9 (node n, local rank 1, pid 5) stopped making progress";
  const RoundEvent se2 = failure_event(stop, "h", 0, 4);
  CHECK(se2.final);
  CHECK(se2.global_rank == 9);
  CHECK(se2.what == stop.hang->what);
  CHECK(decode_event(encode(se2)).final);
}

TEST_CASE("a final failure event stops every node even with restarts left", "[unit][launch]") {
  RoundFacts f;
  f.max_restarts = 3;
  RoundEvent ev;
  ev.kind = RoundEvent::Kind::failure;
  ev.exit_code = kHangExitCode;
  ev.final = true;
  f.event = ev;
  const Decision d = decide(f);
  CHECK(d.kind == Decision::Kind::stop_and_report);
  CHECK(d.exit_code == kHangExitCode);
  CHECK(d.report == Report::remote_failure);
  // The posting node with --on-hang=stop and restarts left stops too.
  RoundFacts mine;
  mine.max_restarts = 3;
  mine.hang = HangReport{};
  mine.hang->stop_job = true;
  mine.posted = true;
  mine.event = ev;
  const Decision m = decide(mine);
  CHECK(m.kind == Decision::Kind::stop_and_report);
  CHECK(m.exit_code == kHangExitCode);
  CHECK(m.report == Report::hang);
  // An event without "final" (an older agent's) decodes as not final.
  CHECK_FALSE(decode_event(R"({"kind":"failure","host":"h","group_rank":0,"global_rank":1,)"
                           R"("local_rank":1,"exit_code":1,"signal":0,"pid":0,"what":"x"})")
                  .final);
}

TEST_CASE("in-place recovery: one declared failure heals, anything more restarts the job",
          "[unit][launch]") {
  auto in_place = [](F x) {
    for (auto& fl : x.f.failures) fl.exit.recovers_in_place = true;
    return x;
  };
  // One worker that declared: heal, whatever the other nodes do meanwhile.
  CHECK(decide(in_place(F().fail(1, 9)).f).kind == Kind::heal);
  // Not declared (any program that does not say so): torchrun's rule.
  CHECK(decide(F().fail(1, 9).f).kind == Kind::post_failure);
  // Two at once, a hang, a spawn error, an event of the round: the job restarts as before.
  CHECK(decide(in_place(F().fail(1).fail(1)).f).kind == Kind::post_failure);
  CHECK(decide(in_place(F().fail(1).hang()).f).kind == Kind::post_failure);
  CHECK(decide(in_place(F().fail(1).spawn()).f).kind == Kind::post_failure);
  CHECK(decide(in_place(F().fail(1).ev(RoundEvent::Kind::failure, 1)).f).kind ==
        Kind::post_failure);
  // A stop signal wins over everything.
  CHECK(decide(in_place(F().fail(1).sig(15)).f).kind == Kind::exit_on_signal);
  // Heals share --max-restarts (2 here) with whole-job restarts.
  F one_left = in_place(F().fail(1));
  one_left.f.restart_count = 1;
  one_left.f.heals = 0;
  CHECK(decide(one_left.f).kind == Kind::heal);
  one_left.f.heals = 1;
  CHECK_FALSE(one_left.f.restarts_left());
  CHECK(decide(one_left.f).kind == Kind::post_failure);
  // After posting, with the budget spent by heals: the job stops.
  F spent = F().fail(1).posted().ev(RoundEvent::Kind::failure, 1);
  spent.f.heals = 2;
  CHECK(decide(spent.f).kind == Kind::stop_and_report);
}
