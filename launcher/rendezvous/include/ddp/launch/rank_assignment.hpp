// Global and role ranks from each node's (role, group rank, local world size), computed as
// torch 2.x's agents do (_assign_worker_ranks): prefix sums in group-rank order, so ranks are
// contiguous per node and node order is group-rank order. Pure; the agent moves the inputs and
// outputs through the store.
#pragma once

#include <string>
#include <vector>

namespace ddp::launch {

struct NodeRoleInfo {
  std::string role;
  int group_rank = 0;
  int local_world_size = 0;
};

struct AssignedRanks {
  int base_global_rank = 0;
  int global_world_size = 0;
  int base_role_rank = 0;
  int role_world_size = 0;
};

// One entry per node, indexed by group rank. Throws ddp::ConfigError when the group ranks are
// not exactly 0..n-1 or a node has no workers.
std::vector<AssignedRanks> assign_ranks(const std::vector<NodeRoleInfo>& nodes);

}  // namespace ddp::launch
