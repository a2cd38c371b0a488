// The ddprun agent for one node: host or join the store, start the local workers with
// torchrun's environment, watch them, restart the group up to --max-restarts, forward the
// signals in --signals-to-handle, and print torchrun's failure summary. This first version
// serves single-node jobs (--standalone, or static/c10d with --nnodes=1); multi-node
// rendezvous is the next step of issue 3.
#pragma once

#include "ddp/launch/config.hpp"
#include "ddp/launch/worker_env.hpp"

namespace ddp::launch {

// Runs the job to its end and returns ddprun's exit code (0, the root cause's exit code, or
// 128 + signal). Throws ddp::ConfigError for a configuration it cannot run.
int run_agent(const LaunchConfig& config, const EnvMap& agent_env);

// --nproc-per-node resolved: an integer as given; cpu = cores; gpu = NVIDIA devices (error
// if none); auto = devices if any, else cores.
int resolve_nproc(const std::string& spec);

}  // namespace ddp::launch
