// The pure parts of a rendezvous round: what each node publishes about itself (NodeDesc), the
// order that gives group ranks, and the round's single outcome (RoundEvent: done, a failure,
// a stop signal, a node that asks to join, or a node lost by the store's liveness check). Text
// encodings are JSON so a person can read them with `ddpstore get`. No sockets here: rendezvous.cpp
// moves these through the store; the unit tests call them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

struct NodeDesc {
  std::string host;  // hostname, shown in messages and summaries
  std::string addr;  // where this node's workers' store would listen (--local-addr or host)
  int pid = 0;       // the agent's pid: tells apart agents on one host
  int nproc = 1;     // local world size
  std::string role = "default";
  int node_rank = -1;        // --node-rank for the static backend, else -1
  int prev_group_rank = -1;  // the group rank this node had in the previous round, else -1
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT this node expects for the round
  // This host's interface addresses (store_access.hpp): the workers' store of a round admits
  // its members' workers by them. At most 64; older agents send none.
  std::vector<std::string> ips;
};

std::string encode(const NodeDesc& node);
// Throws ddp::ProtocolError naming what is wrong with `text`.
NodeDesc decode_node(std::string_view text);

// Indices into `nodes` in group-rank order. Static: by --node-rank. Otherwise nodes that had a
// group rank keep their relative order (ranks stay stable across rounds where they can), and
// new nodes follow, sorted by (host, pid) as torch sorts its participants.
std::vector<int> group_rank_order(const std::vector<NodeDesc>& nodes, bool by_node_rank);

// The restart count of a round: the highest any node expects (a node that just joined the job
// expects 0, the nodes that lived through a failed round expect one more than before).
int round_restart_count(const std::vector<NodeDesc>& nodes);

// What one node learns when a round forms: computed once by the node that sealed the round
// (the only one that reads every description), written per node, read by each node alone.
struct Assignment {
  int group_rank = 0;
  int group_world_size = 1;
  int restart_count = 0;
  int base_global_rank = 0;  // global rank of the node's local rank 0
  int world_size = 1;        // workers over all nodes
  int base_role_rank = 0;
  int role_world_size = 1;
  bool abandoned = false;  // the round ended before it formed (a member died): go on to the next
};

// Assignments for nodes given in arrival order (index k-1 for arrival k): group ranks by
// group_rank_order, global and role ranks by assign_ranks (torch's prefix sums), and the
// round's restart count.
std::vector<Assignment> assign_round(const std::vector<NodeDesc>& nodes, bool by_node_rank);

std::string encode(const Assignment& a);
Assignment decode_assignment(std::string_view text);  // throws ddp::ProtocolError

struct RoundEvent {
  enum class Kind { done, failure, signal, join, lost };
  Kind kind = Kind::done;
  std::string host;      // the node that posted it
  int group_rank = -1;   // its group rank
  int global_rank = -1;  // failure: the failed worker's rank
  int local_rank = -1;
  int exit_code = 0;   // failure: ddprun's exit code for it (code, or 128 + signal)
  int signal = 0;      // signal: the signal the agent received
  int pid = 0;         // lost: the agent that stopped answering
  std::string what;    // failure: "exitcode 3" / "Signal 9 (SIGKILL)"
  bool final = false;  // failure: ends the job even with restarts left (--on-hang=stop)

  // One line for the other nodes' logs.
  std::string describe() const;
  // Whether the round that follows counts against --max-restarts (only worker failures do).
  bool counts_as_restart() const { return kind == Kind::failure; }
};

// How many nodes the next round expects after `event` ended a round of `members` nodes: the
// node that expects it seals the next round at once instead of waiting for the last call.
int next_round_expect(const RoundEvent& event, int members, int max_nodes);

std::string encode(const RoundEvent& event);
RoundEvent decode_event(std::string_view text);  // throws ddp::ProtocolError

}  // namespace ddp::launch
