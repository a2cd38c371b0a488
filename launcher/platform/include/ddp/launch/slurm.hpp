// Slurm's compressed lists, expanded without calling scontrol: host lists
// ("n[1-3,7]", "gpu-[01-04]", "rack[1-2]-n[01-02]", "a,b[5-6]") and per-node counts
// ("2(x3),1" as in SLURM_TASKS_PER_NODE). Pure; a malformed list is a ConfigError naming it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

// Every host, in Slurm's order (ranges in order, several bracket groups as a cartesian product
// with the last varying fastest); zero padding kept. At most `limit` hosts.
std::vector<std::string> expand_hostlist(std::string_view list, std::size_t limit = 1 << 20);
// "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expand_counts(std::string_view list);

}  // namespace ddp::launch
