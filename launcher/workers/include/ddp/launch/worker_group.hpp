// WorkerGroup: the local worker processes of one attempt. Each worker runs in its own process
// group (signals reach its children too) and dies with the agent (PR_SET_PDEATHSIG). Exits are
// seen through pidfds, so waiting is event-driven, not a polling sleep. A worker inherits only
// fds 0-2 and the ones ddprun itself inherited (Options::inherited_fds): every other fd of the
// agent (store sockets, pipes of other workers) is closed between fork and exec.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launch/oom.hpp"
#include "ddp/launch/worker_env.hpp"

namespace ddp::launch {

struct WorkerSpec {
  std::vector<std::string> argv;
  EnvMap env;
  int stdout_fd = -1;  // dup2'ed onto the worker's stdout/stderr; -1: inherit the agent's
  int stderr_fd = -1;
  // --numa-binding (numa_binding.hpp), applied between fork and exec: the CPUs (OS indexes) the
  // worker may run on (empty: the agent's) and the NUMA node its memory is preferred from
  // (MPOL_PREFERRED; -1: the default policy; a refusal is ignored, it is only a preference).
  std::vector<int> cpus{};
  int mem_node = -1;
  // An fd of the agent (>= 3, normally close-on-exec) that this worker alone keeps open across
  // exec, at the same number: its progress pipe (progress.hpp). -1: none.
  int keep_fd = -1;
  int control_fd = -1;  // the same, for its control pipe's read end (DDPRUN_CONTROL_FD)
};

// The fds open in this process now (for main(), before it opens any: what ddprun inherited).
std::vector<int> list_open_fds();

struct WorkerExit {
  int local_rank = -1;
  pid_t pid = -1;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal ended it (then exit_code is 0)
  std::chrono::system_clock::time_point when;
  OomFinding oom;  // a SIGKILL the agent did not send: whether the OOM killer's (oom.hpp)
  bool recovers_in_place = false;  // the worker declared in-place recovery (progress.hpp)
  bool failed() const { return signal != 0 || exit_code != 0; }
  // torchrun-style: the exit code, or "Signal 11 (SIGSEGV)"; an OOM kill's headline follows.
  std::string describe() const;
  // In words, for people: "exit code 2", or describe()'s signal text.
  std::string in_words() const;
};

class WorkerGroup {
 public:
  struct Options {
    // fds >= 3 that workers keep (those ddprun got from its parent); all others are closed.
    std::vector<int> inherited_fds;
    // RLIMIT_NOFILE's soft limit to give back to workers (the agent raises its own); -1: as is.
    long long nofile_soft = -1;
  };
  WorkerGroup() = default;
  explicit WorkerGroup(Options options);
  ~WorkerGroup();  // kills and reaps whatever still runs
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts one process per spec, local rank = index. Throws ddp::ConfigError naming the
  // program when it cannot be executed (the other workers are then stopped).
  void start(const std::vector<WorkerSpec>& specs);
  // Starts one more worker, local rank = the number started before. Throws as start() does.
  void spawn(const WorkerSpec& spec);
  // Starts local rank `local_rank` again (its worker has exited and been reaped): in-place
  // recovery's replacement. Throws as spawn() does, stopping only the new process.
  void respawn(int local_rank, const WorkerSpec& spec);

  // The next worker to exit, or nullopt if none did before `timeout`.
  std::optional<WorkerExit> wait_any(std::chrono::milliseconds timeout);

  // Sends `sig` to the process group of every worker still running.
  void signal_all(int sig);

  // SIGTERM (or `sig`) to all, up to `grace` for them to exit, then SIGKILL; reaps everything.
  // Returns the exits it collected.
  std::vector<WorkerExit> stop(std::chrono::milliseconds grace, int sig = 15);

  // For an event loop that polls more than workers: the pidfds of running workers, and the
  // exit of the worker whose pidfd became readable.
  std::vector<int> live_pidfds() const;
  WorkerExit reap_pidfd(int pidfd);

  std::size_t running() const;
  std::vector<pid_t> pids() const;

 private:
  struct Worker {
    int local_rank;
    pid_t pid;
    int pidfd;
    bool done;
    OomWatch oom{};          // its cgroup's OOM-kill count at spawn
    bool sigkilled = false;  // the agent sent it SIGKILL (then it is no OOM question)
  };
  WorkerExit reap(Worker& w);
  Worker launch(std::size_t rank, const WorkerSpec& spec);  // fork + exec; throws, leaving none
  Options options_;
  std::vector<Worker> workers_;
};

}  // namespace ddp::launch
