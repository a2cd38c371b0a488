// Encodings and ordering rules of a rendezvous round (see round.hpp).
#include "ddp/launch/round.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>

#include "ddp/launch/rank_assignment.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

using nlohmann::json;

json parse_object(std::string_view text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    throw ProtocolError(std::string("malformed ") + what + " in the store: '" +
                        std::string(text.substr(0, 200)) + "'");
  }
  return j;
}

template <typename T>
T field(const json& j, const char* name, const char* what) {
  auto it = j.find(name);
  if (it == j.end()) {
    throw ProtocolError(std::string(what) + " in the store lacks '" + name + "': " + j.dump());
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw ProtocolError(std::string(what) + " in the store has a bad '" + name + "': " + j.dump());
  }
}

const char* kind_name(RoundEvent::Kind k) {
  switch (k) {
    case RoundEvent::Kind::done: return "done";
    case RoundEvent::Kind::failure: return "failure";
    case RoundEvent::Kind::signal: return "signal";
    case RoundEvent::Kind::join: return "join";
    case RoundEvent::Kind::lost: return "lost";
  }
  return "?";
}

}  // namespace

std::string encode(const NodeDesc& n) {
  return json{{"host", n.host},
              {"addr", n.addr},
              {"pid", n.pid},
              {"nproc", n.nproc},
              {"role", n.role},
              {"node_rank", n.node_rank},
              {"prev_group_rank", n.prev_group_rank},
              {"restart_count", n.restart_count},
              {"ips", n.ips}}
      .dump();
}

NodeDesc decode_node(std::string_view text) {
  json j = parse_object(text, "node description");
  const char* w = "a node description";
  NodeDesc n;
  n.host = field<std::string>(j, "host", w);
  n.addr = field<std::string>(j, "addr", w);
  n.pid = field<int>(j, "pid", w);
  n.nproc = field<int>(j, "nproc", w);
  n.role = field<std::string>(j, "role", w);
  n.node_rank = field<int>(j, "node_rank", w);
  n.prev_group_rank = field<int>(j, "prev_group_rank", w);
  n.restart_count = field<int>(j, "restart_count", w);
  if (j.contains("ips")) {
    n.ips = field<std::vector<std::string>>(j, "ips", w);
    if (n.ips.size() > 64) throw ProtocolError("a node description lists more than 64 addresses");
  }
  if (n.nproc <= 0) throw ProtocolError("a node description has nproc <= 0: " + j.dump());
  return n;
}

std::vector<int> group_rank_order(const std::vector<NodeDesc>& nodes, bool by_node_rank) {
  std::vector<int> idx(nodes.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int i) {
    const NodeDesc& n = nodes[static_cast<std::size_t>(i)];
    if (by_node_rank) return std::make_tuple(n.node_rank, std::string(), 0, i);
    // Nodes with a previous rank first, in that order; then new nodes by (host, pid).
    int had = n.prev_group_rank >= 0 ? n.prev_group_rank : 1 << 30;
    return std::make_tuple(had, n.host, n.pid, i);
  };
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return key(a) < key(b); });
  return idx;
}

int round_restart_count(const std::vector<NodeDesc>& nodes) {
  int rc = 0;
  for (const auto& n : nodes) rc = std::max(rc, n.restart_count);
  return rc;
}

std::vector<Assignment> assign_round(const std::vector<NodeDesc>& nodes, bool by_node_rank) {
  const auto order = group_rank_order(nodes, by_node_rank);
  std::vector<NodeRoleInfo> infos;
  for (std::size_t g = 0; g < order.size(); ++g) {
    const NodeDesc& n = nodes[static_cast<std::size_t>(order[g])];
    infos.push_back({n.role, static_cast<int>(g), n.nproc});
  }
  const auto ranks = assign_ranks(infos);
  const int rc = round_restart_count(nodes);
  std::vector<Assignment> out(nodes.size());
  for (std::size_t g = 0; g < order.size(); ++g) {
    Assignment& a = out[static_cast<std::size_t>(order[g])];
    a.group_rank = static_cast<int>(g);
    a.group_world_size = static_cast<int>(nodes.size());
    a.restart_count = rc;
    a.base_global_rank = ranks[g].base_global_rank;
    a.world_size = ranks[g].global_world_size;
    a.base_role_rank = ranks[g].base_role_rank;
    a.role_world_size = ranks[g].role_world_size;
  }
  return out;
}

std::string encode(const Assignment& a) {
  if (a.abandoned) return json{{"abandoned", true}}.dump();
  return json{{"group_rank", a.group_rank},          {"group_world_size", a.group_world_size},
              {"restart_count", a.restart_count},    {"base_global_rank", a.base_global_rank},
              {"world_size", a.world_size},          {"base_role_rank", a.base_role_rank},
              {"role_world_size", a.role_world_size}}
      .dump();
}

Assignment decode_assignment(std::string_view text) {
  json j = parse_object(text, "rank assignment");
  const char* w = "a rank assignment";
  Assignment a;
  if (auto it = j.find("abandoned"); it != j.end() && it->is_boolean() && it->get<bool>()) {
    a.abandoned = true;
    return a;
  }
  a.group_rank = field<int>(j, "group_rank", w);
  a.group_world_size = field<int>(j, "group_world_size", w);
  a.restart_count = field<int>(j, "restart_count", w);
  a.base_global_rank = field<int>(j, "base_global_rank", w);
  a.world_size = field<int>(j, "world_size", w);
  a.base_role_rank = field<int>(j, "base_role_rank", w);
  a.role_world_size = field<int>(j, "role_world_size", w);
  return a;
}

std::string RoundEvent::describe() const {
  switch (kind) {
    case Kind::done: return "every node finished";
    case Kind::failure:
      return "rank " + std::to_string(global_rank) + " (local_rank " + std::to_string(local_rank) +
             ") on " + host + " (group rank " + std::to_string(group_rank) + ") failed: " + what;
    case Kind::signal:
      return "the agent on " + host + " (group rank " + std::to_string(group_rank) +
             ") was stopped by signal " + std::to_string(signal);
    case Kind::join: return "a new node (" + host + ") asks to join the job";
    case Kind::lost:
      return "the agent on " + host + " (pid " + std::to_string(pid) +
             ") died or stopped answering the store";
  }
  return "?";
}

int next_round_expect(const RoundEvent& event, int members, int max_nodes) {
  switch (event.kind) {
    case RoundEvent::Kind::failure: return members;
    case RoundEvent::Kind::join: return std::min(members + 1, max_nodes);
    case RoundEvent::Kind::signal:
    case RoundEvent::Kind::lost: return std::max(members - 1, 0);
    case RoundEvent::Kind::done: return 0;
  }
  return 0;
}

std::string encode(const RoundEvent& e) {
  return json{{"kind", kind_name(e.kind)},
              {"host", e.host},
              {"group_rank", e.group_rank},
              {"global_rank", e.global_rank},
              {"local_rank", e.local_rank},
              {"exit_code", e.exit_code},
              {"signal", e.signal},
              {"pid", e.pid},
              {"what", e.what},
              {"final", e.final}}
      .dump();
}

RoundEvent decode_event(std::string_view text) {
  json j = parse_object(text, "round event");
  const char* w = "a round event";
  RoundEvent e;
  auto kind = field<std::string>(j, "kind", w);
  if (kind == "done") {
    e.kind = RoundEvent::Kind::done;
  } else if (kind == "failure") {
    e.kind = RoundEvent::Kind::failure;
  } else if (kind == "signal") {
    e.kind = RoundEvent::Kind::signal;
  } else if (kind == "join") {
    e.kind = RoundEvent::Kind::join;
  } else if (kind == "lost") {
    e.kind = RoundEvent::Kind::lost;
  } else {
    throw ProtocolError("a round event has an unknown kind '" + kind + "'");
  }
  e.host = field<std::string>(j, "host", w);
  e.group_rank = field<int>(j, "group_rank", w);
  e.global_rank = field<int>(j, "global_rank", w);
  e.local_rank = field<int>(j, "local_rank", w);
  e.exit_code = field<int>(j, "exit_code", w);
  e.signal = field<int>(j, "signal", w);
  e.pid = field<int>(j, "pid", w);
  e.what = field<std::string>(j, "what", w);
  // Absent in events of agents from before --on-hang: not final.
  if (auto it = j.find("final"); it != j.end()) {
    if (!it->is_boolean()) throw ProtocolError("a round event's 'final' is not a boolean");
    e.final = it->get<bool>();
  }
  return e;
}

}  // namespace ddp::launch
