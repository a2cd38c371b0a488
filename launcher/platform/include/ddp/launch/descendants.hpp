// Nothing started under a worker outlives the agent, at any depth (issue 14). The agent is a
// child subreaper, so orphans of its subtree (double forks, setsid'ed daemons) stay its
// descendants; at every round's stop and at exit it freezes (SIGSTOP) and then SIGKILLs every
// descendant it finds through /proc, and it reaps the orphans it inherits. For the agent's own
// SIGKILL, a watcher process forked at the start of main snapshots the descendants every
// ~50 ms and, when the agent's pipe reaches EOF, kills what it recorded, their descendants and
// the members of the process groups it recorded (a worker's group). A process that left its
// worker's group (setsid) less than one snapshot before the agent's SIGKILL, and whose parent
// died with the agent, can escape it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace ddp::launch {

// A process, told apart from a later one with a reused pid by its start time.
struct ProcId {
  pid_t pid = 0;
  std::uint64_t starttime = 0;  // /proc/PID/stat field 22
  pid_t pgrp = 0;
};

struct ProcStat {
  char state = 0;  // 'R', 'S', 'T', 'Z', ...
  pid_t ppid = 0;
  pid_t pgrp = 0;
  std::uint64_t starttime = 0;
};

// /proc/PID/stat; false when the process is gone.
bool read_proc_stat(pid_t pid, ProcStat& out);

// Every process below `root` now (through /proc/PID/task/*/children, or a scan of /proc where
// the kernel has no children files), without `exclude` and its subtree.
std::vector<ProcId> descendants(pid_t root, pid_t exclude = -1);

// Freezes and kills every descendant of `root` (-1: none) and every process of `also` that is
// still the same process, with their descendants, skipping `exclude`. Repeats until a pass
// finds nothing new (bounded). Returns how many processes it killed.
int kill_tree(pid_t root, const std::vector<ProcId>& also = {}, pid_t exclude = -1);

// Sends `sig` to every descendant of this process outside the process groups in `skip_pgrps`
// (the workers' groups, which WorkerGroup signals itself), skipping `exclude`.
void signal_descendants(int sig, const std::vector<pid_t>& skip_pgrps, pid_t exclude);

// Reaps every exited child of this process whose pid is not in `keep` (the workers, which
// WorkerGroup reaps). Never blocks.
void reap_orphans(const std::vector<pid_t>& keep);

// Makes this process the child subreaper of its subtree (PR_SET_CHILD_SUBREAPER).
void become_subreaper();

// Forks the watcher (call early in main, before threads and sockets exist). The pipe end that
// keeps it waiting (`*pipe_fd`) stays open, close-on-exec, in this process. Returns the
// watcher's pid, or -1 when it could not be started (the job then runs without it). With
// main's argv, the watcher's command line reads "ddprun-watcher" (ps, pgrep, scripts that
// count ddprun processes see one agent per node, not two).
pid_t start_watcher(int* pipe_fd, int argc = 0, char** argv = nullptr);
// At a normal exit: closes the pipe and waits (up to 5 s) for the watcher's last pass, so no
// zombie and no process of the job is left once ddprun has exited.
void stop_watcher(pid_t watcher, int pipe_fd);

}  // namespace ddp::launch
