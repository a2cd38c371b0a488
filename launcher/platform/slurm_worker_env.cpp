// Slurm's task variables for one worker, as srun would have set them for a task of a step whose
// tasks are ddprun's workers (see slurm_worker_env.hpp; docs/launcher.md lists them).
#include "ddp/launch/slurm_worker_env.hpp"

namespace ddp::launch {

bool under_slurm(const std::map<std::string, std::string>& env) {
  return env.count("SLURM_JOB_ID") > 0 || env.count("SLURM_JOBID") > 0;
}

const std::vector<std::string>& slurm_worker_variables() {
  static const std::vector<std::string> kNames = {"SLURM_PROCID",
                                                  "SLURM_LOCALID",
                                                  "SLURM_NODEID",
                                                  "SLURM_NTASKS",
                                                  "SLURM_NPROCS",
                                                  "SLURM_STEP_NUM_TASKS",
                                                  "SLURM_NTASKS_PER_NODE",
                                                  "SLURM_NNODES",
                                                  "SLURM_STEP_NUM_NODES",
                                                  "SLURM_TASKS_PER_NODE",
                                                  "SLURM_STEP_TASKS_PER_NODE",
                                                  "SLURM_GTIDS"};
  return kNames;
}

void apply_slurm_worker_env(std::map<std::string, std::string>& env, const SlurmWorkerRanks& r) {
  const auto n = [](int v) { return std::to_string(v); };
  env["SLURM_PROCID"] = n(r.rank);
  env["SLURM_LOCALID"] = n(r.local_rank);
  env["SLURM_NODEID"] = n(r.group_rank);
  for (const char* name : {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"}) {
    env[name] = n(r.world_size);
  }
  env["SLURM_NTASKS_PER_NODE"] = n(r.local_world_size);
  env["SLURM_NNODES"] = n(r.group_world_size);
  env["SLURM_STEP_NUM_NODES"] = n(r.group_world_size);
  // Slurm's compressed counts: "4(x2)" is 4 tasks on each of 2 nodes.
  const bool uniform = r.local_world_size * r.group_world_size == r.world_size;
  for (const char* name : {"SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"}) {
    if (uniform) {
      env[name] = n(r.local_world_size) +
                  (r.group_world_size > 1 ? "(x" + n(r.group_world_size) + ")" : "");
    } else {
      env.erase(name);
    }
  }
  std::string gtids;
  for (int i = 0; i < r.local_world_size; ++i) {
    gtids += (i ? "," : "") + n(r.base_global_rank + i);
  }
  env["SLURM_GTIDS"] = gtids;
}

}  // namespace ddp::launch
