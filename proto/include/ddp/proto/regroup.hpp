// The agent's regroup line: what ddprun tells a running worker when its elastic job shrank or
// grew around it (issue 34, docs/worker_runtime.md "Regrouping without a restart"). One line on
// the worker's progress socket, agent to worker:
//   regroup round=<n> rank=<r> world=<w> local_rank=<l> local_world=<lw> group_rank=<g>
//           group_world=<gw> master=<addr>:<port> joining=<j>
// Pure: formatting and parsing, no descriptors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ddp {

struct Regroup {
  int round = 0;  // the agents' rendezvous round: the workers' namespace for the new group
  int rank = 0;   // this worker's RANK in the new group
  int world = 1;  // WORLD_SIZE
  int local_rank = 0;
  int local_world = 1;
  int group_rank = 0;
  int group_world = 1;
  std::string master_addr;  // the new group's store (MASTER_ADDR, MASTER_PORT)
  std::uint16_t master_port = 0;
  // Ranks of the new group that start anew (a joining node's) and take their state from the
  // running ones: a running worker trains on until they are ready (docs/worker_runtime.md).
  int joining = 0;
  bool operator==(const Regroup&) const = default;
};

// The line, newline included.
std::string format_regroup(const Regroup& r);
// One line (without its newline). Throws ddp::ConfigError naming the field that is missing,
// repeated, unknown or out of range (rank < world, local_rank < local_world, ...).
Regroup parse_regroup(std::string_view line);

}  // namespace ddp
