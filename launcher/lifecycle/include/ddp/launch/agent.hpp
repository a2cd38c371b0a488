// The ddprun agent for one node: host or join the store, start the local workers with
// torchrun's environment, watch them, restart the group up to --max-restarts, forward the
// signals in --signals-to-handle, and print torchrun's failure summary. The rounds are run by
// the lifecycle loop (lifecycle.hpp) and decided by the policy (policy.hpp).
#pragma once

#include <sys/types.h>

#include <vector>

#include "ddp/launch/config.hpp"
#include "ddp/launch/worker_env.hpp"

namespace ddp::launch {

// What main() set up for the agent before anything else was opened.
struct AgentProcess {
  std::vector<int> inherited_fds;  // fds >= 3 ddprun got from its parent: the workers get them
  long long nofile_soft = -1;      // RLIMIT_NOFILE's soft limit as ddprun got it (-1: as is)
  pid_t watcher = -1;              // the orphan watcher (descendants.hpp); -1: none
};

// Runs the job to its end and returns ddprun's exit code (0, the root cause's exit code, or
// 128 + signal). Throws ddp::ConfigError for a configuration it cannot run.
int run_agent(const LaunchConfig& config, const EnvMap& agent_env,
              const AgentProcess& process = {});

// --nproc-per-node resolved: an integer as given; cpu = the CPUs this process may run on
// (sched_getaffinity, as torch); gpu = the NVIDIA GPUs visible through `env`'s
// CUDA_VISIBLE_DEVICES (gpu_devices.hpp; a ConfigError if none); auto = those GPUs, else CPUs.
int resolve_nproc(const std::string& spec, const EnvMap& env);

}  // namespace ddp::launch
