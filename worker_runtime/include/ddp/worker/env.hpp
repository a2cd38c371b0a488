// The worker's view of torchrun's environment contract (torch-compat.md §2), as ddprun and
// torchrun export it: read, type-checked and cross-checked once at start, with an error that
// names the variable and what is wrong with it. Pure: the environment comes in as a map.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ddp::worker {

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
  std::string role_name = "default";
  std::string master_addr;
  std::uint16_t master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True: the agent hosts the store
  std::string error_file;        // TORCHELASTIC_ERROR_FILE; empty: none

  // The key prefix torch's init_process_group("env://") uses in the agent's store, so that
  // C++ and Python workers of one job share keys: "/worker/attempt_<restart_count>".
  std::string store_prefix() const;
};

// Throws ddp::ConfigError, e.g. "RANK is not set (is this process started by ddprun or
// torchrun?)", "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4", "MASTER_PORT='x' is not a port".
// Variables other than RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT default as for a single
// process (LOCAL_RANK = RANK, LOCAL_WORLD_SIZE = WORLD_SIZE, ...), like a plain
// init_process_group("env://") run.
WorkerEnv read_worker_env(const std::map<std::string, std::string>& env);

}  // namespace ddp::worker
