// What ddprun reads from Slurm's environment when the command line does not say: the node
// count, node rank, run id, workers per node and rendezvous host of an `srun ddprun` task (or
// of ddprun run straight from a one-node batch script), and the stop grace that fits under
// Slurm's KillWait. Pure: env and file text in, defaults and messages out (docs/slurm.md).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

struct SlurmDefaults {
  bool active = false;   // SLURM_JOB_ID is set: inside a Slurm job
  bool in_step = false;  // an srun task (SLURM_STEP_ID set), not the batch script itself
  std::string job;       // "12" or "12.0" for messages
  // Defaults as "--flag=value", put in front of PET_* and the command line (which win).
  std::vector<std::string> args;
  // The first host of the step's (else the job's) node list: the rendezvous host. Empty when
  // it cannot be derived; endpoint_problem then says why.
  std::string first_host;
  std::string endpoint_problem;
  // Set when the Slurm-derived node count cannot be right (several ddprun tasks on one node,
  // or a multi-node job's batch script running ddprun once); an error unless --nnodes is given.
  std::string layout_problem;
  // A malformed SLURM_* value, by the flag it would have supplied ("--nnodes" -> message naming
  // the variable): an error only when the command line does not give that flag.
  std::map<std::string, std::string> problems;
};

// Never throws: what cannot be derived is in endpoint_problem, layout_problem and problems.
SlurmDefaults slurm_defaults(const std::map<std::string, std::string>& env);

// KillWait from slurm.conf's text (case-insensitive key; comments skipped); nullopt if absent.
std::optional<int> parse_kill_wait(std::string_view slurm_conf);

// The grace between forwarding a stop signal to the workers and killing them: the configured
// one (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30 s), but under Slurm short enough that the
// agent still reports before slurmstepd's SIGKILL at KillWait: KillWait - max(1 s, 10%),
// at least 0.5 s.
std::chrono::milliseconds stop_grace(std::chrono::milliseconds configured,
                                     std::optional<int> kill_wait_s);

}  // namespace ddp::launch
