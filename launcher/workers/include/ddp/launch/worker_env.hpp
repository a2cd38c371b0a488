// What each worker process gets: its command line (python -u [-m] script args, or the program
// itself with --no-python, ${local_rank} substituted) and torchrun 2.x's environment contract
// (torch-compat.md §2) on top of the agent's own environment. Pure: no process is started here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddp/launch/config.hpp"

namespace ddp::launch {

using EnvMap = std::map<std::string, std::string>;

// Where this node sits in the current rendezvous round; the same for all its workers.
struct GroupInfo {
  int group_rank = 0;        // this node's rank among the nodes (GROUP_RANK)
  int group_world_size = 1;  // nodes in the round
  int base_global_rank = 0;  // global rank of this node's local rank 0
  int world_size = 1;        // workers over all nodes
  int local_world_size = 1;  // workers on this node
  int base_role_rank = 0;
  int role_world_size = 1;
  int restart_count = 0;
  std::string master_addr;  // the store the workers' init_process_group("env://") uses
  std::uint16_t master_port = 0;
  std::string run_id;
  std::string attempt_dir;  // <log_dir>/<run>/attempt_<n>; empty: no error files
  // >= 0: the round in which this node's running workers regrouped (or which its new workers
  // join while others keep running): workers started now join that group
  // (DDPRUN_JOIN_ROUND, docs/worker_runtime.md "Regrouping").
  int join_round = -1;
  int joining_ranks = 0;  // ... and how many of its ranks start anew (a joining node's)
};

// True when `path` is an ELF file (a compiled program), which ddprun runs directly, as with
// --no-python: python could not run it. Torchrun would hand it to python and fail.
bool is_native_executable(const std::string& path);
// A bare command name ("ddp-train") as exec would find it: the first executable file of that
// name in PATH's folders (/bin:/usr/bin when PATH is empty); "" when none (or when the name
// has a '/').
std::string find_on_path(const std::string& name, const std::string& path_var);

// The interpreter Python workers run, and why (for the line the agent prints at start):
// PYTHON_EXEC when set; else, for a ddprun installed from a wheel (`from_wheel`), the python3
// (or python) of the environment it was installed in: beside its executable in `exe_dir`, or
// in <prefix>/bin when auditwheel put it in <prefix>/lib/pythonX.Y/site-packages/
// ddprun.scripts, so
// that /venv/bin/ddprun runs /venv/bin/python3 without an activated venv (torchrun runs its
// own interpreter); else "python3" from PATH.
struct PythonChoice {
  std::string path;  // "python3": looked up in PATH
  std::string why;
};
PythonChoice choose_python(const EnvMap& agent_env, const std::string& exe_dir, bool from_wheel);

// The worker's argv: PYTHON_EXEC in `agent_env`, else config.python, else python3 runs a
// Python entrypoint.
std::vector<std::string> worker_argv(const LaunchConfig& config, int local_rank,
                                     const EnvMap& agent_env);

// The agent's environment plus the worker's variables (these win over inherited ones, except
// TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS, which keep an inherited value).
// --virtual-local-rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES (and HIP_VISIBLE_DEVICES when the
// agent has it) = this worker's entry of the agent's list, or its local rank when unset
// (torchrun's rule). --per-worker-slurm-env under Slurm: SLURM_PROCID ... (slurm_worker_env.hpp).
EnvMap worker_env(const LaunchConfig& config, const GroupInfo& group, int local_rank,
                  const EnvMap& agent_env);

// Checks made once before the rendezvous, for `nproc` workers: --virtual-local-rank with a
// CUDA_VISIBLE_DEVICES (or HIP_VISIBLE_DEVICES) shorter than nproc is a ConfigError. Returns a
// note for stderr ("" if none): --per-worker-slurm-env outside a Slurm job does nothing.
std::string check_worker_env_options(const LaunchConfig& config, int nproc,
                                     const EnvMap& agent_env);

}  // namespace ddp::launch
