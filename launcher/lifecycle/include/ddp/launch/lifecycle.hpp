// The agent's lifecycle loop: rendezvous -> spawn -> watch -> decide -> apply, one turn per
// round, until a decision ends the job. The loop only applies policy.hpp's decisions; the
// rendezvous, the workers and what happens to them sit behind the three ports below (real
// ones: agent_ports.hpp; fakes: tests/unit/launcher/lifecycle/lifecycle_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launch/policy.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/round_workers.hpp"
#include "ddp/launch/worker_env.hpp"
#include "ddp/launch/worker_group.hpp"

namespace ddp::launch {

class StatusReporter;

// What forming one round gave this node.
struct Formed {
  Formation kind = Formation::formed;
  int signal = 0;       // a stop signal ended the rendezvous (kind is then irrelevant)
  std::string message;  // timed_out: why
  Round round;          // formed: this node's part, and the workers' store
  std::string master_addr;
  std::uint16_t master_port = 0;
};

// The rendezvous as the loop sees it (real: Rendezvous over the agent's store).
class RendezvousPort {
 public:
  virtual ~RendezvousPort() = default;
  // Joins round `hint` (-1: the job's current one) expecting `expect` nodes (0: unknown), and
  // hosts or finds the workers' store. Throws what Rendezvous::next_round throws otherwise.
  virtual Formed form(const NodeDesc& self, int hint, int expect) = 0;
  // Every local worker exited 0 (the last node to say so posts "done").
  virtual void finished(const Round& round) = 0;
  // Posts `event` unless another holds already; returns the one that holds.
  virtual RoundEvent end_round(const Round& round, const RoundEvent& event, bool reopen) = 0;
  // This node leaves the job for good; never throws.
  virtual void depart(const Round& round) = 0;
  // The agent is stopping (a stop signal): from now on nothing waits for a store that is away.
  virtual void stopping() {}
  // The job's in-place heals (one counter for every node and round): adds `add`, returns the
  // total. Throws ddp::Error when the store cannot be reached.
  virtual int count_heals(const Round& round, int add) {
    (void)round;
    return add;
  }
  // Regrouping (an elastic job that shrank or grew): this node says whether it carries running
  // workers into `round`; returns how many nodes do (every node said; > 0: the round regroups
  // around them). Throws ddp::Error when the store cannot be reached.
  virtual int agree_regroup(const Round& round, bool carry) {
    (void)round;
    (void)carry;
    return 0;
  }
};

// One round's workers (real: WorkerGroup + OutputPump, round_workers.hpp).
class WorkerLauncher {
 public:
  virtual ~WorkerLauncher() = default;
  // Creates the round's attempt_<n> log directory; "" when files are off. Throws ddp::IoError.
  virtual std::string make_attempt(int restart_count) = 0;
  // Starts the workers; what stopped the start early, if anything.
  virtual SpawnResult start(const GroupInfo& group) = 0;
  // Stops the workers and everything below the agent with `sig` (then SIGKILL after the
  // grace period), and drains their output.
  virtual void stop(int sig) = 0;
  // The workers all succeeded: drains their output and kills what they left behind.
  virtual void finish() = 0;
  virtual void remove_temporary_logs() = 0;
  virtual void clear() = 0;  // forgets the round's workers before the next round
  // In-place recovery: starts local rank `local_rank` again, alone, as the replacement of the
  // worker that died (DDPRUN_HEAL=heal in its environment); "" when started, else why not.
  virtual std::string respawn(int local_rank, int heal) {
    (void)local_rank;
    (void)heal;
    return "this launcher cannot start one worker alone";
  }
  // Regrouping: whether every local worker runs and declared "recover=elastic".
  virtual bool can_regroup() { return false; }
  // Tells the running workers their places in `group` (each its regroup line) instead of
  // starting new ones; `since`: when the change began (their first step after it ends it).
  virtual SpawnResult regroup(const GroupInfo& group, std::chrono::system_clock::time_point since) {
    (void)group;
    (void)since;
    SpawnResult r;
    r.error = "this launcher cannot regroup running workers";
    return r;
  }
};

// What happened since the last look, in priority order: a stop signal ends the look at once,
// then the failed exits of this turn; otherwise whether all workers are done and the event.
struct Observation {
  int stop_signal = 0;
  std::vector<WorkerExit> failed;
  bool all_done = false;
  std::optional<RoundEvent> event;
  bool store_lost = false;
  std::string store_error;
  std::optional<HangReport> hang;  // this node's hang monitor asks to restart or stop
};

// What happens during a round (real: one poll over pidfds, signalfds, the event watcher and
// the output pipes; signals to pass on and orphans are handled inside).
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual void open(const Round& round) = 0;  // watch this round's event
  virtual int take_signal() = 0;              // the pending stop signal (0: none)
  virtual Observation wait() = 0;             // blocks until something happened
  virtual void unwatch() = 0;                 // stops watching the round's event
};

struct LifecycleConfig {
  NodeDesc self;  // this node, as it joins its first round
  std::string run_id;
  std::string entrypoint;   // named in the failure summary
  std::string store_where;  // "host:port" of the rendezvous store, for messages
  int nproc = 1;
  int max_restarts = 0;
  int max_nodes = 1;
  bool elastic = false;  // --nnodes MIN:MAX with MIN < MAX: a round may regroup its workers
  bool solo = false;
  StatusReporter* status = nullptr;  // the live status (status_reporter.hpp); null: none
};

// The cause label of what ended a round (status/record.hpp's kCauses).
std::string cause_of(const RoundEvent& event);
std::string cause_of(const WorkerExit& exit);

// Runs rounds until a decision ends the job; returns ddprun's exit code.
int run_lifecycle(const LifecycleConfig& config, RendezvousPort& rdzv, WorkerLauncher& workers,
                  EventSource& events);

}  // namespace ddp::launch
