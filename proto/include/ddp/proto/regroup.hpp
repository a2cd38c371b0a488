// The agent's lines to a running worker (issue 34, docs/worker_runtime.md), one a line on the
// worker's control pipe (DDPRUN_CONTROL_FD):
// - regroup: its elastic job shrank or grew around it ("Regrouping"):
//     regroup round=<n> rank=<r> world=<w> local_rank=<l> local_world=<lw> group_rank=<g>
//             group_world=<gw> master=<addr>:<port> joining=<j>
// - peer_lost: a rank of its node died and is being replaced in place ("In-place recovery"),
//   so a collective that cannot see the death itself (NCCL between GPUs of one node) stops:
//     peer_lost rank=<global rank> heal=<the heal's ordinal>
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

struct PeerLost {
  int rank = 0;  // the dead worker's RANK
  int heal = 1;  // its replacement's DDPRUN_HEAL
  bool operator==(const PeerLost&) const = default;
};

std::string format_peer_lost(const PeerLost& p);  // newline included
// Throws ddp::ConfigError naming what is wrong.
PeerLost parse_peer_lost(std::string_view line);

// The line's first word: "regroup", "peer_lost", or "" for anything else.
std::string_view agent_line_kind(std::string_view line);

}  // namespace ddp
