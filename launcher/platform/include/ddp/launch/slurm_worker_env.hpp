// --per-worker-slurm-env: Slurm's task variables rewritten for each worker from its ranks, so a
// script written for `srun python train.py` (one task per GPU, ranked by SLURM_PROCID) runs
// unchanged under `srun --ntasks-per-node=1 ddprun ...`: each worker sees the variables srun
// would have given it had it started the workers itself. Off by default (torchrun leaves them).
// SLURM_JOB_* (the allocation), node lists, CPU and GPU counts, SLURM_TASK_PID and PMI_*/PMIX_*
// are left as the agent got them. Pure: an environment map in, the same map rewritten.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddp::launch {

// One worker's place, as its torchrun variables say.
struct SlurmWorkerRanks {
  int rank = 0;              // RANK
  int local_rank = 0;        // LOCAL_RANK as exported (0 under --virtual-local-rank)
  int group_rank = 0;        // GROUP_RANK
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  int group_world_size = 1;  // GROUP_WORLD_SIZE
  int base_global_rank = 0;  // RANK of this node's local rank 0
};

// True when the agent runs inside a Slurm job (SLURM_JOB_ID or SLURM_JOBID set).
bool under_slurm(const std::map<std::string, std::string>& env);

// The variables apply_slurm_worker_env writes (or removes), for the docs and tests.
const std::vector<std::string>& slurm_worker_variables();

// Writes, in `env`:
//   SLURM_PROCID = RANK, SLURM_LOCALID = LOCAL_RANK, SLURM_NODEID = GROUP_RANK,
//   SLURM_NTASKS = SLURM_NPROCS = SLURM_STEP_NUM_TASKS = WORLD_SIZE,
//   SLURM_NTASKS_PER_NODE = LOCAL_WORLD_SIZE,
//   SLURM_NNODES = SLURM_STEP_NUM_NODES = GROUP_WORLD_SIZE,
//   SLURM_TASKS_PER_NODE = SLURM_STEP_TASKS_PER_NODE = "L(xN)" in Slurm's notation ("L" for one
//     node) when every node has L workers; removed when nodes differ (not known here),
//   SLURM_GTIDS = the global ranks of this node's workers ("4,5,6,7").
void apply_slurm_worker_env(std::map<std::string, std::string>& env, const SlurmWorkerRanks& r);

}  // namespace ddp::launch
