// Prefix sums over nodes in group-rank order: global ranks, and ranks within each role.
#include "ddp/launch/rank_assignment.hpp"

#include <map>

#include "ddp/proto/error.hpp"

namespace ddp::launch {

std::vector<AssignedRanks> assign_ranks(const std::vector<NodeRoleInfo>& nodes) {
  std::vector<const NodeRoleInfo*> by_rank(nodes.size(), nullptr);
  for (const auto& n : nodes) {
    if (n.group_rank < 0 || static_cast<std::size_t>(n.group_rank) >= nodes.size()) {
      throw ConfigError("group rank " + std::to_string(n.group_rank) + " is outside 0.." +
                        std::to_string(nodes.size() - 1));
    }
    if (by_rank[static_cast<std::size_t>(n.group_rank)] != nullptr) {
      throw ConfigError("two nodes claim group rank " + std::to_string(n.group_rank));
    }
    if (n.local_world_size <= 0) {
      throw ConfigError("node " + std::to_string(n.group_rank) + " has no workers");
    }
    by_rank[static_cast<std::size_t>(n.group_rank)] = &n;
  }
  std::map<std::string, int> role_totals;
  int total = 0;
  for (const auto* n : by_rank) {
    total += n->local_world_size;
    role_totals[n->role] += n->local_world_size;
  }
  std::vector<AssignedRanks> out(nodes.size());
  std::map<std::string, int> role_seen;
  int seen = 0;
  for (std::size_t r = 0; r < by_rank.size(); ++r) {
    const auto& n = *by_rank[r];
    out[r] = {seen, total, role_seen[n.role], role_totals[n.role]};
    seen += n.local_world_size;
    role_seen[n.role] += n.local_world_size;
  }
  return out;
}

}  // namespace ddp::launch
