// The worker environment as ddprun/torchrun export it: read and typed, single-process defaults
// for the optional parts, and a message naming the variable for every missing, malformed or
// inconsistent value. The agent's own worker_env() output must read back unchanged.
#include "ddp/worker/device.hpp"
#include "ddp/worker/env.hpp"

#include <catch2/catch.hpp>

#include "support/group_info.hpp"
#include "ddp/launch/worker_env.hpp"
#include "ddp/proto/error.hpp"

using namespace ddp::worker;
using Env = std::map<std::string, std::string>;

namespace {
Env minimal() {
  return {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}};
}
std::string error_of(Env env) {
  try {
    read_worker_env(env);
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("what ddprun exports reads back exactly", "[unit][worker]") {
  ddp::launch::LaunchConfig cfg;
  cfg.role = "trainer";
  cfg.max_restarts = 3;
  const auto g = ddp::test::second_of_two_nodes("gpu-01", 40123, "job7");
  auto w = read_worker_env(ddp::launch::worker_env(cfg, g, 1, {}));
  CHECK(w.rank == 5);
  CHECK(w.local_rank == 1);
  CHECK(w.world_size == 8);
  CHECK(w.local_world_size == 4);
  CHECK(w.group_rank == 1);
  CHECK(w.group_world_size == 2);
  CHECK(w.role_rank == 5);
  CHECK(w.role_name == "trainer");
  CHECK(w.master_addr == "gpu-01");
  CHECK(w.master_port == 40123);
  CHECK(w.restart_count == 2);
  CHECK(w.max_restarts == 3);
  CHECK(w.run_id == "job7");
  CHECK(w.use_agent_store);
  CHECK(w.error_file == "/logs/job7_x/attempt_2/1/error.json");
  CHECK(w.store_prefix() == "/worker/attempt_2");  // torch's env:// prefix: shared keys
}

TEST_CASE("a plain env:// environment gets single-node defaults", "[unit][worker]") {
  auto w = read_worker_env(minimal());
  CHECK(w.local_rank == 3);
  CHECK(w.local_world_size == 4);
  CHECK(w.group_world_size == 1);
  CHECK(w.role_rank == 3);
  CHECK_FALSE(w.use_agent_store);
  CHECK(w.error_file.empty());
}

TEST_CASE("missing, malformed and inconsistent values are named", "[unit][worker]") {
  Env e = minimal();
  e.erase("RANK");
  CHECK_THAT(error_of(e), Catch::Contains("RANK is not set") && Catch::Contains("ddprun"));
  e = minimal();
  e["WORLD_SIZE"] = "four";
  CHECK_THAT(error_of(e), Catch::Contains("WORLD_SIZE 'four' is not an integer"));
  e = minimal();
  e["RANK"] = "4";
  CHECK_THAT(error_of(e), Catch::Contains("RANK=4 is not below WORLD_SIZE=4"));
  e = minimal();
  e["LOCAL_WORLD_SIZE"] = "2";
  e["LOCAL_RANK"] = "2";
  CHECK_THAT(error_of(e), Catch::Contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  e = minimal();
  e["LOCAL_WORLD_SIZE"] = "8";
  CHECK_THAT(error_of(e), Catch::Contains("LOCAL_WORLD_SIZE=8 exceeds WORLD_SIZE=4"));
  e = minimal();
  e["MASTER_PORT"] = "70000";
  CHECK_THAT(error_of(e), Catch::Contains("MASTER_PORT='70000' is not a port"));
  e = minimal();
  e.erase("MASTER_ADDR");
  CHECK_THAT(error_of(e), Catch::Contains("MASTER_ADDR is not set"));
  e = minimal();
  e["RANK"] = "-1";
  CHECK_THAT(error_of(e), Catch::Contains("RANK '-1' is out of range"));
  e = minimal();
  e["GROUP_RANK"] = "2";
  e["GROUP_WORLD_SIZE"] = "2";
  CHECK_THAT(error_of(e), Catch::Contains("GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"));
  e = minimal();
  e["TORCHELASTIC_RESTART_COUNT"] = "1x";
  CHECK_THAT(error_of(e), Catch::Contains("TORCHELASTIC_RESTART_COUNT '1x' is not an integer"));
}

TEST_CASE("a worker's GPU: LOCAL_RANK among the visible ones, or the only one", "[unit][worker]") {
  using ddp::worker::pick_cuda_device;
  CHECK(pick_cuda_device(0, 4, "") == 0);
  CHECK(pick_cuda_device(3, 4, "") == 3);
  CHECK(pick_cuda_device(3, 1, "2") == 0);  // Slurm --gpus-per-task=1: each task sees its own
  CHECK_THROWS_WITH(
      pick_cuda_device(4, 4, "0,1,2,3"),
      Catch::Contains("LOCAL_RANK=4") && Catch::Contains("CUDA_VISIBLE_DEVICES=0,1,2,3"));
  CHECK_THROWS_WITH(pick_cuda_device(0, 0, ""), Catch::Contains("no CUDA device"));
}
