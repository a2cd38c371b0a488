// Tests of slurm_worker_env.hpp: the variables a Slurm-written script (and PyTorch Lightning's
// SLURMEnvironment) reads, rewritten per worker as srun would have set them.
#include "ddp/launch/slurm_worker_env.hpp"

#include <catch2/catch.hpp>

using namespace ddp::launch;

namespace {
using Env = std::map<std::string, std::string>;

// What srun --ntasks-per-node=1 gives the agent on the second of two nodes.
Env agent_on_second_node() {
  return {{"SLURM_JOB_ID", "42"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "1"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "1"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_NPROCS", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NTASKS_PER_NODE", "1"},
          {"SLURM_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_NNODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_GTIDS", "1"},
          {"SLURM_NODELIST", "dn[1-2]"},
          {"SLURM_CPUS_PER_TASK", "4"},
          {"PATH", "/bin"}};
}
}  // namespace

TEST_CASE("under Slurm means SLURM_JOB_ID (or the old SLURM_JOBID) is set",
          "[unit][launch][slurm]") {
  CHECK(under_slurm({{"SLURM_JOB_ID", "1"}}));
  CHECK(under_slurm({{"SLURM_JOBID", "1"}}));
  CHECK_FALSE(under_slurm({{"SLURM_PROCID", "0"}}));
  CHECK_FALSE(under_slurm({}));
}

TEST_CASE("each worker gets the task variables srun would have given it", "[unit][launch][slurm]") {
  // 2 nodes x 3 workers; this is local rank 1 of node 1: global rank 4.
  auto env = agent_on_second_node();
  apply_slurm_worker_env(env, SlurmWorkerRanks{4, 1, 1, 6, 3, 2, 3});
  CHECK(env.at("SLURM_PROCID") == "4");
  CHECK(env.at("SLURM_LOCALID") == "1");
  CHECK(env.at("SLURM_NODEID") == "1");
  CHECK(env.at("SLURM_NTASKS") == "6");
  CHECK(env.at("SLURM_NPROCS") == "6");
  CHECK(env.at("SLURM_STEP_NUM_TASKS") == "6");
  CHECK(env.at("SLURM_NTASKS_PER_NODE") == "3");
  CHECK(env.at("SLURM_TASKS_PER_NODE") == "3(x2)");
  CHECK(env.at("SLURM_STEP_TASKS_PER_NODE") == "3(x2)");
  CHECK(env.at("SLURM_NNODES") == "2");
  CHECK(env.at("SLURM_STEP_NUM_NODES") == "2");
  CHECK(env.at("SLURM_GTIDS") == "3,4,5");
  // The allocation and everything else: as the agent got them.
  CHECK(env.at("SLURM_JOB_ID") == "42");
  CHECK(env.at("SLURM_STEP_ID") == "0");
  CHECK(env.at("SLURM_JOB_NUM_NODES") == "2");
  CHECK(env.at("SLURM_NODELIST") == "dn[1-2]");
  CHECK(env.at("SLURM_CPUS_PER_TASK") == "4");
  CHECK(env.at("PATH") == "/bin");
  // Every documented variable was written.
  for (const auto& name : slurm_worker_variables()) CHECK(env.count(name) == 1);
}

TEST_CASE("one node: counts without the (xN) suffix", "[unit][launch][slurm]") {
  Env env = {{"SLURM_JOB_ID", "7"}};
  apply_slurm_worker_env(env, SlurmWorkerRanks{0, 0, 0, 4, 4, 1, 0});
  CHECK(env.at("SLURM_TASKS_PER_NODE") == "4");
  CHECK(env.at("SLURM_GTIDS") == "0,1,2,3");
  CHECK(env.at("SLURM_NNODES") == "1");
}

TEST_CASE("nodes with different worker counts: the per-node lists are removed, not guessed",
          "[unit][launch][slurm]") {
  // Node 1 has 2 workers, node 0 had 3: world 5.
  auto env = agent_on_second_node();
  apply_slurm_worker_env(env, SlurmWorkerRanks{4, 1, 1, 5, 2, 2, 3});
  CHECK(env.count("SLURM_TASKS_PER_NODE") == 0);
  CHECK(env.count("SLURM_STEP_TASKS_PER_NODE") == 0);
  CHECK(env.at("SLURM_NTASKS_PER_NODE") == "2");  // this node's
  CHECK(env.at("SLURM_NTASKS") == "5");
  CHECK(env.at("SLURM_GTIDS") == "3,4");
}
