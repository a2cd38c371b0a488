// The agent's lifecycle loop (lifecycle.hpp): form a round, start the workers, gather what
// happens into RoundFacts, ask decide() (policy.hpp), and apply the decision: keep waiting,
// post this node's failure, succeed, restart or re-form for the next round, or stop.
#include "ddp/launch/lifecycle.hpp"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "ddp/launch/agent_error_file.hpp"
#include "ddp/launch/failure_report.hpp"
#include "ddp/launch/status_reporter.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {

namespace {

using Kind = Decision::Kind;

GroupInfo group_of(const Formed& formed, const LifecycleConfig& c) {
  GroupInfo g;
  g.master_addr = formed.master_addr;
  g.master_port = formed.master_port;
  g.group_rank = formed.round.group_rank;
  g.group_world_size = formed.round.group_world_size;
  g.base_global_rank = formed.round.base_global_rank;
  g.world_size = formed.round.world_size;
  g.local_world_size = c.nproc;
  g.base_role_rank = formed.round.base_role_rank;
  g.role_world_size = formed.round.role_world_size;
  g.restart_count = formed.round.restart_count;
  g.run_id = c.run_id;
  return g;
}

// Adds what one look at the round saw to the facts (signals this node to tell the store that
// its workers all succeeded, once).
void observe(RoundFacts& f, const Observation& o, const GroupInfo& g, const std::string& host) {
  f.stop_signal = o.stop_signal;
  for (const WorkerExit& e : o.failed) {
    Failure fl;
    fl.exit = e;
    fl.global_rank = g.base_global_rank + e.local_rank;
    fl.host = host;
    if (!g.attempt_dir.empty()) {
      fl.error_file = g.attempt_dir + "/" + std::to_string(e.local_rank) + "/error.json";
    }
    f.failures.push_back(std::move(fl));
  }
  if (o.event) f.event = o.event;
  if (o.hang) f.hang = o.hang;
  f.store_lost = f.store_lost || o.store_lost;
}

// The round could not be formed, or a stop signal ended the wait.
int stop_unformed(const Decision& d, const Formed& formed) {
  if (d.kind == Kind::exit_on_signal) {
    std::fprintf(stderr, "ddprun: received signal %d (%s) during the rendezvous; stopping\n",
                 formed.signal, strsignal(formed.signal));
  } else if (d.report == Report::rendezvous_timeout) {
    std::fprintf(stderr, "ddprun: %s\n", formed.message.c_str());
  } else if (d.report == Report::spare_not_needed) {
    std::fprintf(stderr,
                 "ddprun: the job finished while this node waited as a spare "
                 "(--nnodes max already reached); nothing to do\n");
  }
  return d.exit_code;
}

// The message of a stop_and_report decision within a round.
void report(const Decision& d, const RoundFacts& f, const LifecycleConfig& c,
            const std::string& store_error) {
  switch (d.report) {
    case Report::local_summary:
      std::fputs(format_failure_summary(c.entrypoint, f.failures).c_str(), stderr);
      note_worker_failures(c.entrypoint, f.failures);  // for $TORCHELASTIC_ERROR_FILE
      break;
    case Report::remote_failure:
      if (f.event->final) {
        std::fprintf(stderr, "ddprun: stopping: %s (--on-hang=stop)\n",
                     f.event->describe().c_str());
      } else {
        std::fprintf(stderr, "ddprun: stopping: %s; no restarts left (--max-restarts=%d)\n",
                     f.event->describe().c_str(), c.max_restarts);
      }
      note_agent_error(f.event->describe());
      break;
    case Report::store_lost:
      std::fprintf(stderr, "ddprun: lost the rendezvous store at %s (%s); stopped the workers\n",
                   c.store_where.c_str(), store_error.c_str());
      break;
    case Report::hang: {
      const std::string what =
          f.hang && !f.hang->what.empty() ? f.hang->what : "the job stopped making progress";
      std::fprintf(stderr, "ddprun: hang: %s; stopping the job (exit code %d)\n", what.c_str(),
                   kHangExitCode);
      note_agent_error("hang: " + what);
      break;
    }
    default: break;
  }
}

// One local worker died and it recovers in place: its replacement starts alone (the others,
// on every node, heal it from a peer), the round goes on. The heal is counted in the store
// against --max-restarts; one over the budget, or a replacement that cannot start, leaves the
// failure to post_failure as before.
void heal_worker(const LifecycleConfig& c, RendezvousPort& rdzv, WorkerLauncher& workers,
                 const Round& round, RoundFacts& f, int& heals) {
  Failure& fl = f.failures.front();
  const WorkerExit& e = fl.exit;
  try {
    heals = f.heals = rdzv.count_heals(round, 1);
  } catch (const Error&) {
    fl.exit.recovers_in_place = false;  // no count, no heal: the store decides as before
    return;
  }
  if (f.restart_count + f.heals > f.max_restarts) {
    fl.exit.recovers_in_place = false;  // another node's heal took the last one
    return;
  }
  const std::string err = workers.respawn(e.local_rank, f.heals);
  if (!err.empty()) {
    f.spawn_error = err;
    f.spawn_rank = e.local_rank;
    fl.exit.recovers_in_place = false;
    return;
  }
  std::fprintf(stderr,
               "ddprun: rank %d (local_rank %d) on %s failed: %s; replaced in place, the others "
               "go on (heal %d; restarts and heals %d of %d)\n",
               fl.global_rank, e.local_rank, fl.host.c_str(), e.in_words().c_str(), f.heals,
               f.restart_count + f.heals, c.max_restarts);
  if (c.status) c.status->failure(cause_of(e));
  f.failures.clear();
}

// The job is over for this node: the live status says so, then ddprun exits with `code`.
int finish(const LifecycleConfig& c, const std::string& state, int code) {
  if (c.status) c.status->finish(state, code);
  return code;
}

}  // namespace

std::string cause_of(const WorkerExit& e) {
  if (e.oom.named()) return "oom";
  return e.signal != 0 ? "signal" : "exitcode";
}

std::string cause_of(const RoundEvent& ev) {
  switch (ev.kind) {
    case RoundEvent::Kind::failure:
      if (ev.what.find("hang") != std::string::npos ||
          ev.what.find("progress") != std::string::npos) {
        return "hang";
      }
      if (ev.what.find("OOM") != std::string::npos ||
          ev.what.find("out of memory") != std::string::npos) {
        return "oom";
      }
      return ev.what.rfind("Signal", 0) == 0 ? "signal" : "exitcode";
    case RoundEvent::Kind::lost: return "node_lost";
    case RoundEvent::Kind::join: return "node_joined";
    case RoundEvent::Kind::signal: return "signal";
    default: return "other";
  }
}

int run_lifecycle(const LifecycleConfig& c, RendezvousPort& rdzv, WorkerLauncher& workers,
                  EventSource& events) {
  NodeDesc self = c.self;
  int heals = 0;  // the job's, as last counted (heals share --max-restarts)
  int hint = -1;
  int expect = 0;
  bool carried = false;  // the workers run on into the next round (regrouping)
  std::chrono::system_clock::time_point regroup_since{};
  StatusReporter* st = c.status;
  while (true) {
    if (st) st->phase("rendezvous", hint < 0 ? "" : "round " + std::to_string(hint));
    const Formed formed = rdzv.form(self, hint, expect);
    RoundFacts f;
    f.formation = formed.kind;
    f.stop_signal = formed.signal;
    f.max_restarts = c.max_restarts;
    f.max_nodes = c.max_nodes;
    f.solo = c.solo;
    if (formed.signal != 0 || formed.kind != Formation::formed) {
      if (carried) workers.stop(formed.signal != 0 ? formed.signal : SIGTERM);
      const Decision d = decide(f);
      const int code = stop_unformed(d, formed);
      return finish(c, formed.signal ? "stopped" : code == 0 ? "succeeded" : "failed", code);
    }
    const Round& round = formed.round;
    f.restart_count = round.restart_count;
    f.heals = heals;
    f.members = round.group_world_size;
    GroupInfo g = group_of(formed, c);
    g.attempt_dir = workers.make_attempt(round.restart_count);  // rank dirs: when spawned
    events.open(round);
    if (st) {
      st->round_formed(round.number, round.group_rank, round.group_world_size, round.world_size,
                       round.restart_count);
      st->phase("spawn", std::to_string(c.nproc) + " workers");
    }

    // Regrouping (elastic jobs): every node says whether it carries running workers into the
    // round; if one does, those are told their new places and new workers join them.
    int carriers = 0;
    if (c.elastic && !c.solo) {
      try {
        carriers = rdzv.agree_regroup(round, carried);
      } catch (const Error& e) {
        std::fprintf(stderr, "ddprun: cannot agree on regrouping (%s); starting anew\n", e.what());
      }
    }
    const bool regroup = carriers > 0;
    if (carried && !regroup) {  // the others start anew: ours do too
      workers.stop(SIGTERM);
      if (st) st->workers_stopped();
      workers.clear();
    }
    if (regroup) {  // every node runs nproc workers: the carriers' run on, the others' join
      g.join_round = round.number;
      g.joining_ranks = std::max(0, round.world_size - carriers * c.nproc);
    }
    // Spawn (or regroup), then watch until the policy says the round is over for this node.
    const SpawnResult spawned =
        carried && regroup ? workers.regroup(g, regroup_since) : workers.start(g);
    if (carried && regroup && spawned.error.empty()) {
      std::fprintf(stderr,
                   "ddprun: the job regrouped around its running workers: %d node%s, %d "
                   "rank%s (round %d); this node's ranks are now %d to %d\n",
                   round.group_world_size, round.group_world_size == 1 ? "" : "s", round.world_size,
                   round.world_size == 1 ? "" : "s", round.number, g.base_global_rank,
                   g.base_global_rank + c.nproc - 1);
    }
    carried = false;
    if (!spawned.error.empty()) {
      f.spawn_error = spawned.error;
      f.spawn_rank = spawned.rank;
    } else if (spawned.stop_signal) {
      f.stop_signal = events.take_signal();
    }
    if (st && spawned.error.empty() && !spawned.stop_signal) st->phase("run");
    std::string store_error;
    Decision d = decide(f);
    while (d.kind == Kind::keep_waiting || d.kind == Kind::heal) {
      if (d.kind == Kind::heal) {
        heal_worker(c, rdzv, workers, round, f, heals);
        d = decide(f);
        continue;
      }
      const Observation o = events.wait();
      observe(f, o, g, self.host);
      if (o.store_lost) store_error = o.store_error;
      if (o.all_done && !f.local_done && o.failed.empty() && o.stop_signal == 0) {
        f.local_done = true;  // every local worker exited 0: wait for the others' outcome
        try {
          rdzv.finished(round);  // rides out an outage within --store-outage-grace
        } catch (const Error& e) {
          f.store_lost = true;
          store_error = e.what();
        }
      }
      d = decide(f);
    }

    bool stopped = false;
    if (d.kind == Kind::post_failure) {
      // The others were stopped by us: not failures of their own.
      if (st) st->phase("stop", "a local failure");
      workers.stop(SIGTERM);
      stopped = true;
      if (st) {
        st->workers_stopped();
        for (const auto& fl : f.failures) st->failure(cause_of(fl.exit));
        if (!f.spawn_error.empty()) st->failure("spawn");
        if (f.hang) st->failure("hang");
      }
      for (auto& fl : f.failures) {
        if (!fl.error_file.empty()) fl.reported = read_error_file(fl.error_file);
      }
      if (!f.spawn_error.empty()) {
        std::fprintf(stderr, "ddprun: %s; %s\n", f.spawn_error.c_str(),
                     f.restarts_left() ? "restarting" : "stopping the job");
      }
      // Workers that recover in place: other nodes may have healed meanwhile (the budget's).
      const bool in_place = std::any_of(f.failures.begin(), f.failures.end(),
                                        [](const auto& x) { return x.exit.recovers_in_place; });
      if (in_place) {
        try {
          heals = f.heals = rdzv.count_heals(round, 0);
        } catch (const Error&) {
          // The store is away: posting the failure below waits for it or gives up.
        }
      }
      const RoundEvent ours = failure_event(f, self.host, round.group_rank, g.base_global_rank);
      try {
        // With the store away, this waits for it (within --store-outage-grace): the other
        // nodes learn of the failure when it is back, and restart together as always.
        f.event = rdzv.end_round(round, ours, f.restarts_left());
        f.posted = true;
      } catch (const Error& e) {
        f.stop_signal = events.take_signal();
        f.store_lost = f.stop_signal == 0;
        store_error = e.what();
        // This node's failure could not be posted: its summary now, then the store's loss.
        if (!f.failures.empty()) {
          std::fputs(format_failure_summary(c.entrypoint, f.failures).c_str(), stderr);
        }
        f.failures.clear();
        f.spawn_error.clear();
        f.hang.reset();
      }
      d = decide(f);
    }

    switch (d.kind) {
      case Kind::exit_on_signal: {
        rdzv.stopping();
        std::fprintf(stderr, "ddprun: received signal %d (%s), forwarding it to the workers\n",
                     f.stop_signal, strsignal(f.stop_signal));
        workers.stop(f.stop_signal);
        RoundEvent ev;
        ev.kind = RoundEvent::Kind::signal;
        ev.host = self.host;
        ev.group_rank = round.group_rank;
        ev.signal = f.stop_signal;
        try {
          rdzv.end_round(round, ev, /*reopen=*/true);
        } catch (const Error&) {
          // The store is gone too; nobody is left to tell.
        }
        return finish(c, "stopped", d.exit_code);
      }
      case Kind::succeed:
        workers.finish();
        rdzv.depart(round);
        workers.remove_temporary_logs();
        return finish(c, "succeeded", 0);
      case Kind::stop_and_report:
        if (!stopped) workers.stop(SIGTERM);
        if (st) st->workers_stopped();
        report(d, f, c, store_error);
        if (d.leave) rdzv.depart(round);
        return finish(c, d.exit_code == 0 ? "succeeded" : "failed", d.exit_code);
      default: break;
    }

    // restart_all or reform: a failure or a stop elsewhere (or ours, with restarts left).
    const std::string what = f.event ? f.event->describe() : "a failure";
    if (st) {
      st->phase("restart", what);
      st->restarting(round.number, f.event ? cause_of(*f.event) : "other", what);
    }
    // A node left or joined an elastic job whose workers regroup: they run on meanwhile.
    carried = d.kind == Kind::reform && c.elastic && !stopped && workers.can_regroup();
    if (!carried) {
      if (!stopped) workers.stop(SIGTERM);
      if (st) st->workers_stopped();
    }
    self.restart_count = d.next_restart_count;
    if (d.kind == Kind::restart_all) {
      std::fprintf(stderr, "ddprun: %s; restarting the workers of every node, restart %d of %d\n",
                   what.c_str(), self.restart_count, c.max_restarts);
    } else if (carried) {
      regroup_since = std::chrono::system_clock::now();
      std::fprintf(stderr,
                   "ddprun: %s; re-forming the job, the workers keep running (regrouping)\n",
                   what.c_str());
    } else {
      std::fprintf(stderr, "ddprun: %s; re-forming the job (not counted as a restart)\n",
                   what.c_str());
    }
    expect = d.next_expect;
    self.prev_group_rank = round.group_rank;
    hint = round.number + 1;
    if (!carried) workers.clear();
    events.unwatch();
  }
}

}  // namespace ddp::launch
