// The pure parts of a rendezvous round: node and event encodings survive a round trip and
// refuse malformed text with a message; group-rank order (static by node rank, c10d stable
// across rounds, new nodes by host then pid); the round's restart count; prefix templates.
#include "ddp/launch/round.hpp"

#include <catch2/catch.hpp>

#include "ddp/launch/worker_output.hpp"
#include "ddp/proto/error.hpp"

using namespace ddp::launch;

namespace {
NodeDesc node(std::string host, int pid, int prev = -1, int node_rank = -1, int rc = 0) {
  NodeDesc n;
  n.host = std::move(host);
  n.addr = n.host;
  n.pid = pid;
  n.prev_group_rank = prev;
  n.node_rank = node_rank;
  n.restart_count = rc;
  return n;
}
}  // namespace

TEST_CASE("node descriptions round-trip and bad ones are named", "[unit][launch]") {
  NodeDesc n = node("gpu-07", 4242, 3, -1, 2);
  n.nproc = 8;
  n.role = "trainer";
  NodeDesc back = decode_node(encode(n));
  CHECK(back.host == "gpu-07");
  CHECK(back.pid == 4242);
  CHECK(back.nproc == 8);
  CHECK(back.role == "trainer");
  CHECK(back.prev_group_rank == 3);
  CHECK(back.restart_count == 2);
  CHECK_THROWS_WITH(decode_node("not json"), Catch::Contains("malformed node description"));
  CHECK_THROWS_WITH(decode_node(R"({"host":"a"})"), Catch::Contains("lacks 'addr'"));
  std::string zero = encode(n);
  zero.replace(zero.find("\"nproc\":8"), 9, "\"nproc\":0");
  CHECK_THROWS_WITH(decode_node(zero), Catch::Contains("nproc <= 0"));
  CHECK_THROWS_AS(decode_node(R"({"host":1,"addr":"a","pid":1,"nproc":1,"role":"r",)"
                              R"("node_rank":0,"prev_group_rank":0,"restart_count":0})"),
                  ddp::ProtocolError);
}

TEST_CASE("events round-trip, unknown kinds are refused", "[unit][launch]") {
  RoundEvent e;
  e.kind = RoundEvent::Kind::failure;
  e.host = "n1";
  e.group_rank = 1;
  e.global_rank = 3;
  e.local_rank = 1;
  e.exit_code = 137;
  e.what = "Signal 9 (SIGKILL)";
  RoundEvent back = decode_event(encode(e));
  CHECK(back.kind == RoundEvent::Kind::failure);
  CHECK(back.exit_code == 137);
  CHECK(back.describe() == "rank 3 (local_rank 1) on n1 (group rank 1) failed: Signal 9 (SIGKILL)");
  std::string bad = encode(e);
  bad.replace(bad.find("failure"), 7, "explode");
  CHECK_THROWS_WITH(decode_event(bad), Catch::Contains("unknown kind 'explode'"));
}

TEST_CASE("static order is by node rank", "[unit][launch]") {
  std::vector<NodeDesc> nodes{node("b", 1, -1, 2), node("a", 2, -1, 0), node("c", 3, -1, 1)};
  CHECK(group_rank_order(nodes, true) == std::vector<int>{1, 2, 0});
}

TEST_CASE("c10d order: first round by host then pid, like torch", "[unit][launch]") {
  std::vector<NodeDesc> nodes{node("h2", 10), node("h1", 30), node("h1", 20)};
  CHECK(group_rank_order(nodes, false) == std::vector<int>{2, 1, 0});
}

TEST_CASE("c10d order: nodes keep their ranks across rounds, new ones follow", "[unit][launch]") {
  // h9 was rank 0 and h1 rank 1 in the previous round; h0 is new.
  std::vector<NodeDesc> nodes{node("h1", 1, 1), node("h0", 1), node("h9", 1, 0)};
  CHECK(group_rank_order(nodes, false) == std::vector<int>{2, 0, 1});
}

TEST_CASE("a round's restart count is the highest expected", "[unit][launch]") {
  CHECK(round_restart_count({node("a", 1, 0, -1, 2), node("b", 1, -1, -1, 0)}) == 2);
  CHECK(round_restart_count({node("a", 1)}) == 0);
}

TEST_CASE("prefix templates expand torchrun's names and ddprun's", "[unit][launch]") {
  PrefixVars v{"trainer", 1, 5, 2, "gpu-03"};
  CHECK(expand_prefix(kDefaultPrefixTemplate, v) == "[trainer1]:");
  CHECK(expand_prefix("${host}/${group_rank}/${rank}: ", v) == "gpu-03/2/5: ");
  CHECK(expand_prefix("", v).empty());
  CHECK(expand_prefix("$ and $x", v) == "$ and $x");
  // torchrun's rules (string.Template.safe_substitute): unknown or unfinished macros are
  // left as written, "$$" is "$", "$name" works without braces, ${hostname} is torchrun's.
  CHECK(expand_prefix("${node}", v) == "${node}");
  CHECK(expand_prefix("${rank", v) == "${rank");
  CHECK(expand_prefix("$$rank=$rank", v) == "$rank=5");
  CHECK(expand_prefix("[${hostname}]", v) == "[gpu-03]");
}

TEST_CASE("a round's assignments: ranks by order, prefix sums, restart count", "[unit][launch]") {
  // arrival order: h2 (4 workers), h1 (2 workers, lived through a failure), h1 with a lower pid
  std::vector<NodeDesc> nodes{node("h2", 5), node("h1", 9, -1, -1, 1), node("h1", 3)};
  nodes[0].nproc = 4;
  nodes[1].nproc = 2;
  nodes[2].nproc = 2;
  auto a = assign_round(nodes, false);
  REQUIRE(a.size() == 3);
  CHECK(a[2].group_rank == 0);  // h1 pid 3
  CHECK(a[1].group_rank == 1);  // h1 pid 9
  CHECK(a[0].group_rank == 2);  // h2
  CHECK(a[2].base_global_rank == 0);
  CHECK(a[1].base_global_rank == 2);
  CHECK(a[0].base_global_rank == 4);
  for (const auto& x : a) {
    CHECK(x.world_size == 8);
    CHECK(x.group_world_size == 3);
    CHECK(x.restart_count == 1);
  }
  auto back = decode_assignment(encode(a[0]));
  CHECK(back.base_global_rank == 4);
  CHECK(back.role_world_size == 8);
  CHECK_THROWS_WITH(decode_assignment("{}"), Catch::Contains("lacks 'group_rank'"));
}
