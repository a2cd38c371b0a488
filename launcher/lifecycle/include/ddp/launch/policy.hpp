// The agent's round-outcome policy, pure: what this node does about what it has seen of a
// round (its workers' exits, a stop signal, the event another node posted, a lost store, the
// rendezvous' own outcome). No processes, sockets, clocks or output: lifecycle.cpp gathers the
// facts and applies the decision; tests/unit/launcher/lifecycle/policy_test.cpp is the whole table.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launch/failure_report.hpp"
#include "ddp/launch/round.hpp"

namespace ddp::launch {

// How forming the round ended (Rendezvous::next_round and the workers' store).
enum class Formation {
  formed,            // this node is a member of a round
  timed_out,         // join_timeout passed (TimeoutError)
  spare_not_needed,  // waited as a spare beyond MAX nodes, and the job finished
};

// The job stopped making progress (hang_monitor.hpp): the leader's agent reports it, with
// --on-hang=restart (a failure of this node, counted against --max-restarts) or stop (the job
// ends on every node with kHangExitCode, restarts left or not).
struct HangReport {
  int local_rank = -1;  // the suspect, when it runs on this node
  int rank = -1;        // the suspect's global rank (-1: none named)
  std::chrono::milliseconds silent{0};
  bool stop_job = false;
  std::string what;  // "rank 1 (node a, local rank 1, pid 7) stopped making progress"
};

// ddprun's exit code for a job ended by a hang (--on-hang=stop, or restart with none left).
inline constexpr int kHangExitCode = 124;

// Everything the policy looks at, as plain data.
struct RoundFacts {
  Formation formation = Formation::formed;
  int restart_count = 0;  // the round's TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;   // --max-restarts
  int members = 1;        // nodes in the round (group world size)
  int max_nodes = 1;      // --nnodes MAX
  bool solo = false;      // --standalone with one node: no other node, no event watcher

  int stop_signal = 0;              // a --signals-to-handle signal this agent received
  std::vector<Failure> failures;    // this node's failed workers, in the order seen
  std::string spawn_error;          // a log directory or file could not be created ...
  int spawn_rank = -1;              // ... for this local rank
  std::optional<HangReport> hang;   // the leader's hang monitor found one to act on
  bool local_done = false;          // every local worker exited 0
  std::optional<RoundEvent> event;  // the round's event (posted by any node)
  bool posted = false;              // this node posted its failure; `event` is what held
  bool store_lost = false;          // the event watcher lost the rendezvous store
  int heals = 0;                    // the job's in-place heals so far (the store's count)

  // Heals and whole-job restarts share --max-restarts.
  bool restarts_left() const { return restart_count + heals < max_restarts; }
  // One local worker failed, alone, and it declared in-place recovery: replace it, and the
  // others (on every node) heal it from a peer without stopping.
  bool healable() const {
    return failures.size() == 1 && failures.front().exit.recovers_in_place && spawn_error.empty() &&
           !hang && !event && restarts_left();
  }
  // This node has a failure of its own to post (a worker, the spawn, a hang).
  bool local_failure() const { return !failures.empty() || !spawn_error.empty() || hang; }
};

// Which message the agent prints when it stops.
enum class Report {
  none,                // nothing more (or printed already: the spawn error)
  local_summary,       // torchrun's failure summary of `failures`
  remote_failure,      // one line naming the failed rank elsewhere, no restarts left
  store_lost,          // the rendezvous store is gone
  rendezvous_timeout,  // the round did not form within join_timeout
  spare_not_needed,    // a spare whose job finished without it
  hang,                // a hung worker, no restarts left
};

struct Decision {
  enum class Kind {
    keep_waiting,     // nothing ends the round yet for this node
    post_failure,     // stop the workers, post this node's failure, then decide again
    succeed,          // the job is done: exit 0
    restart_all,      // every node restarts its workers: counted against --max-restarts
    reform,           // the job re-forms (a node joined, left, was lost): not counted
    stop_and_report,  // stop the job: exit_code, print `report`
    exit_on_signal,   // stop on this agent's signal: 128 + signal
    heal,             // replace the one failed worker alone; the round goes on (counted)
  };
  Kind kind = Kind::keep_waiting;
  int exit_code = 0;  // succeed, stop_and_report, exit_on_signal
  Report report = Report::none;
  bool leave = false;          // tell the store this node leaves the job (succeed, stop_and_report)
  int next_restart_count = 0;  // restart_all, reform: the count the next round expects
  int next_expect = 0;         // restart_all, reform: nodes the next round expects
};

// The rules, highest first (one poll turn can see several facts; the first wins):
//  1. the round did not form: timed out -> stop (1); spare not needed -> stop (0);
//  2. a stop signal -> exit_on_signal (128 + signal), whatever else was seen;
//  3. after posting its failure: no restarts left -> stop (the local root cause's code, or 1
//     for a spawn error or hang), leaving; else the event that held decides as in 6;
//  4. a local failure: one worker alone that declared in-place recovery, restarts (heals
//     included) left -> heal; otherwise (workers, spawn, hang) -> post_failure;
//  5. solo and every local worker exited 0 -> succeed (no event to wait for);
//  6. an event: done -> succeed; failure -> restart_all if restarts are left, else stop with
//     the event's code (1 if it has none); signal, join, lost -> reform (not counted);
//  7. the store lost -> stop (1), not leaving (there is no store to tell);
//  8. otherwise keep_waiting (also when the local workers all finished: wait for the others).
Decision decide(const RoundFacts& facts);

// The event this node posts for its own failure: the earliest failure (`failures` is sorted by
// time in place; read the error files first), or the spawn error, or the hang.
RoundEvent failure_event(RoundFacts& facts, const std::string& host, int group_rank,
                         int base_global_rank);

}  // namespace ddp::launch
