// One GroupInfo for the tests of the worker contract: the second of two nodes, four workers
// each, third attempt. Shared by the launcher's env tests and the worker runtime's.
#pragma once

#include <string>

#include "ddp/launch/worker_env.hpp"

namespace ddp::test {

inline launch::GroupInfo second_of_two_nodes(const std::string& master, int port,
                                             const std::string& run_id) {
  launch::GroupInfo g;
  g.group_rank = 1;
  g.group_world_size = 2;
  g.base_global_rank = 4;
  g.world_size = 8;
  g.local_world_size = 4;
  g.base_role_rank = 4;
  g.role_world_size = 8;
  g.restart_count = 2;
  g.master_addr = master;
  g.master_port = static_cast<std::uint16_t>(port);
  g.run_id = run_id;
  g.attempt_dir = "/logs/" + run_id + "_x/attempt_2";
  return g;
}

}  // namespace ddp::test
