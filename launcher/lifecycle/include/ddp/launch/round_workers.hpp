// Starting and stopping one round's workers. Workers start one at a time: a rank's log
// directory, files and pipes are made just before its fork (only for ranks that start), and a
// stop signal is looked for between two forks, so SIGTERM during a long spawn takes effect at
// once. Stopping sends the signal to the workers' groups and to every other descendant, waits
// up to the grace period for the workers, then SIGKILLs whatever is left below the agent.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "ddp/launch/config.hpp"
#include "ddp/launch/progress.hpp"
#include "ddp/launch/worker_env.hpp"
#include "ddp/launch/worker_group.hpp"
#include "ddp/launch/worker_output.hpp"

namespace ddp::launch {

struct SpawnPlan {
  const LaunchConfig& config;
  const GroupInfo& group;
  const EnvMap& agent_env;
  std::string prefix_template;
  std::string host;
  int nproc = 1;
  // When set, each worker gets a pipe of its own to report progress on, named by
  // DDPRUN_PROGRESS_FD in its environment, and one the agent writes to (DDPRUN_CONTROL_FD);
  // `progress` keeps the agent's ends.
  ProgressReader* progress = nullptr;
};

struct SpawnResult {
  bool stop_signal = false;  // a stop signal is pending on the signalfd (left unread)
  std::string error;         // a log directory or file could not be created
  int rank = -1;             // ... for this local rank
};

// Starts plan.nproc workers into `workers`, their output into `pump`. Stops early (the
// workers started so far keep running) when `sigfd` is readable or a log file cannot be made.
// Throws what WorkerGroup::spawn throws (a program that cannot be executed) and what
// numa_bindings_for_round throws (a --numa-binding that cannot be met).
SpawnResult spawn_workers(const SpawnPlan& plan, OutputPump& pump, WorkerGroup& workers, int sigfd);

// In-place recovery: starts local rank `r` again, alone, with its round environment plus
// DDPRUN_HEAL=<heal> (its logs in <attempt>/<r>/heal_<heal>/, its progress pipe new); the
// other workers keep running. "" when started, else why not (a log file, an exec failure).
std::string respawn_worker(const SpawnPlan& plan, int r, int heal, OutputPump& pump,
                           WorkerGroup& workers);

// Stops the round: `sig` to the workers and every other descendant of the agent (except
// `watcher`), up to `grace` for the workers to exit, then SIGKILL for all that is left below
// the agent; reaps the orphans it inherited.
void stop_round(WorkerGroup& workers, std::chrono::milliseconds grace, int sig, pid_t watcher);

// After a round whose workers all exited: kills what they left behind (daemons, double forks).
void clear_leftovers(pid_t watcher);

}  // namespace ddp::launch
