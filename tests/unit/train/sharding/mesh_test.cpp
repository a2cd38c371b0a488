// The 2-D mesh's pure pieces (issue 20): parse_mesh's forms and each of its errors, place_mesh
// on contiguous, interleaved and uneven hosts (tp groups kept on one host where they can be;
// every rank in exactly one row and one column), and the log line of MeshPlace::describe.
#include "mesh.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"

using namespace ddp::train;

namespace {

bool same(MeshShape a, MeshShape b) { return a.dp == b.dp && a.tp == b.tp; }

// Every rank in exactly one tp group and one dp group, at the positions its indices say.
void check_consistent(const MeshPlace& p) {
  const std::size_t n = p.dp.size();
  REQUIRE(p.tp.size() == n);
  REQUIRE(p.tp_groups.size() == static_cast<std::size_t>(p.shape.dp));
  REQUIRE(p.dp_groups.size() == static_cast<std::size_t>(p.shape.tp));
  std::vector<int> in_tp(n, 0);
  std::vector<int> in_dp(n, 0);
  for (std::size_t i = 0; i < p.tp_groups.size(); ++i) {
    REQUIRE(p.tp_groups[i].size() == static_cast<std::size_t>(p.shape.tp));
    for (std::size_t k = 0; k < p.tp_groups[i].size(); ++k) {
      const auto r = static_cast<std::size_t>(p.tp_groups[i][k]);
      ++in_tp[r];
      CHECK(p.dp[r] == static_cast<int>(i));
      CHECK(p.tp[r] == static_cast<int>(k));
    }
  }
  for (std::size_t j = 0; j < p.dp_groups.size(); ++j) {
    REQUIRE(p.dp_groups[j].size() == static_cast<std::size_t>(p.shape.dp));
    for (std::size_t k = 0; k < p.dp_groups[j].size(); ++k) {
      const auto r = static_cast<std::size_t>(p.dp_groups[j][k]);
      ++in_dp[r];
      CHECK(p.tp[r] == static_cast<int>(j));
      CHECK(p.dp[r] == static_cast<int>(k));
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    CHECK(in_tp[r] == 1);
    CHECK(in_dp[r] == 1);
  }
}

bool tp_groups_on_one_host(const MeshPlace& p, const std::vector<std::string>& hosts) {
  for (const auto& g : p.tp_groups) {
    std::set<std::string> seen;
    for (int r : g) seen.insert(hosts[static_cast<std::size_t>(r)]);
    if (seen.size() != 1) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("parse_mesh: dp and tp in either order, one of them, or none", "[unit][train][mesh]") {
  CHECK(same(parse_mesh("dp=2,tp=4", 8), {2, 4}));
  CHECK(same(parse_mesh("tp=4,dp=2", 8), {2, 4}));
  CHECK(same(parse_mesh("tp=2", 8), {4, 2}));
  CHECK(same(parse_mesh("dp=8", 8), {8, 1}));
  CHECK(same(parse_mesh("dp=1", 1), {1, 1}));
  CHECK(same(parse_mesh("", 6), {6, 1}));
  CHECK(same(parse_mesh(" dp = 3 , tp = 2 ", 6), {3, 2}));  // spaces around the parts
  CHECK(same(parse_mesh("tp=8", 8), {1, 8}));
  CHECK(same(parse_mesh("dp=1,tp=4096", 4096), {1, kMaxMeshDim}));
}

TEST_CASE("parse_mesh: every error names --mesh and what is wrong", "[unit][train][mesh]") {
  using Catch::Contains;
  const auto err = [](const char* text, int world) {
    try {
      parse_mesh(text, world);
    } catch (const ddp::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err("pp=2", 2), Contains("--mesh") && Contains("unknown key \"pp\""));
  CHECK_THAT(err("dp=2,dp=2", 4), Contains("--mesh") && Contains("dp is given twice"));
  CHECK_THAT(err("tp=1,tp=1", 1), Contains("tp is given twice"));
  CHECK_THAT(err("dp=x", 2), Contains("--mesh") && Contains("dp=x is not a positive integer"));
  CHECK_THAT(err("dp=0", 2), Contains("dp=0 is not a positive integer"));
  CHECK_THAT(err("dp=-2", 2), Contains("dp=-2 is not a positive integer"));
  CHECK_THAT(err("tp=1.5", 2), Contains("tp=1.5 is not a positive integer"));
  CHECK_THAT(err("tp=", 2), Contains("tp= has no value"));
  CHECK_THAT(err("tp=4097", 4097), Contains("past the largest mesh dimension, 4096"));
  CHECK_THAT(err("dp=99999999999999999999", 2), Contains("past the largest mesh dimension"));
  CHECK_THAT(err("dp=2,tp=3", 4),
             Contains("--mesh") && Contains("dp x tp = 2 x 3 = 6") && Contains("4 ranks"));
  CHECK_THAT(err("tp=3", 4), Contains("tp=3 does not divide the world's 4 ranks"));
  CHECK_THAT(err("dp=3", 4), Contains("dp=3 does not divide the world's 4 ranks"));
  CHECK_THAT(err("dp", 2), Contains("\"dp\" is not key=value"));
  CHECK_THAT(err("dp=2,", 2), Contains("\"\" is not key=value"));
  CHECK_THAT(err(",dp=2", 2), Contains("is not key=value"));
  CHECK_THAT(err("dp=2;tp=1", 2), Contains("not a positive integer"));
  CHECK_THAT(err("", 0), Contains("--mesh") && Contains("0 ranks"));
}

TEST_CASE("place_mesh: contiguous hosts keep each tp group on its host", "[unit][train][mesh]") {
  const std::vector<std::string> hosts = {"node-a", "node-a", "node-b", "node-b"};
  const MeshPlace p = place_mesh(hosts, {2, 2});
  check_consistent(p);
  CHECK(p.dp == std::vector<int>{0, 0, 1, 1});  // rank r -> (r / T, r % T)
  CHECK(p.tp == std::vector<int>{0, 1, 0, 1});
  CHECK(p.tp_groups == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(p.dp_groups == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
  CHECK_FALSE(p.tp_crosses_nodes);
  CHECK(tp_groups_on_one_host(p, hosts));
}

TEST_CASE("place_mesh: interleaved hosts still keep each tp group on one host",
          "[unit][train][mesh]") {
  const std::vector<std::string> hosts = {"a", "b", "a", "b", "a", "b", "a", "b"};
  const MeshPlace p = place_mesh(hosts, {4, 2});
  check_consistent(p);
  // Host a (its lowest rank is 0) first: 0 2 4 6, then host b: 1 3 5 7.
  CHECK(p.tp_groups == std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}});
  CHECK(p.dp_groups == std::vector<std::vector<int>>{{0, 4, 1, 5}, {2, 6, 3, 7}});
  CHECK_FALSE(p.tp_crosses_nodes);
  CHECK(tp_groups_on_one_host(p, hosts));
  // tp = 4: each host's four ranks are one tp group.
  const MeshPlace q = place_mesh(hosts, {2, 4});
  check_consistent(q);
  CHECK(q.tp_groups == std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK_FALSE(q.tp_crosses_nodes);
}

TEST_CASE("place_mesh: hosts in the order of their lowest rank, not by name",
          "[unit][train][mesh]") {
  const std::vector<std::string> hosts = {"z", "z", "a", "a"};
  const MeshPlace p = place_mesh(hosts, {2, 2});
  CHECK(p.tp_groups == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
}

TEST_CASE("place_mesh: a host count not a multiple of tp makes a tp group cross nodes",
          "[unit][train][mesh]") {
  const std::vector<std::string> hosts = {"a", "a", "a", "b", "b", "b"};
  const MeshPlace p = place_mesh(hosts, {3, 2});
  check_consistent(p);
  CHECK(p.tp_groups == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}});
  CHECK(p.tp_crosses_nodes);
  CHECK_FALSE(tp_groups_on_one_host(p, hosts));
  // tp = 3 fits each host: nothing crosses.
  CHECK_FALSE(place_mesh(hosts, {2, 3}).tp_crosses_nodes);
  // One host, or tp = 1: never crosses.
  CHECK_FALSE(place_mesh({"h", "h", "h", "h"}, {1, 4}).tp_crosses_nodes);
  CHECK_FALSE(place_mesh(hosts, {6, 1}).tp_crosses_nodes);
}

TEST_CASE("place_mesh: every shape of a mix of hosts puts each rank in one row and one column",
          "[unit][train][mesh]") {
  const std::vector<std::string> hosts = {"c", "a", "a", "b", "c", "b",
                                          "a", "c", "b", "a", "c", "b"};
  for (int tp : {1, 2, 3, 4, 6, 12}) {
    const MeshPlace p = place_mesh(hosts, {12 / tp, tp});
    INFO("tp=" << tp);
    check_consistent(p);
    CHECK(p.tp_crosses_nodes == (tp > 4 || (4 % tp != 0)));  // 4 ranks per host
  }
}

TEST_CASE("place_mesh: a shape that does not fit the hosts is a ConfigError",
          "[unit][train][mesh]") {
  CHECK_THROWS_AS(place_mesh({"a", "a", "a"}, {2, 2}), ddp::ConfigError);
  CHECK_THROWS_WITH(place_mesh({"a", "a", "a"}, {2, 2}),
                    Catch::Contains("--mesh dp=2,tp=2") && Catch::Contains("3 ranks"));
  CHECK_THROWS_WITH(place_mesh({"a"}, {0, 1}), Catch::Contains("--mesh"));
  CHECK_THROWS_WITH(place_mesh({}, {1, 1}), Catch::Contains("0 ranks"));
}

TEST_CASE("MeshPlace::describe: one line, each tp group with its host or the hosts it spans",
          "[unit][train][mesh]") {
  const std::vector<std::string> hosts = {"node-a", "node-a", "node-b", "node-b"};
  CHECK(place_mesh(hosts, {2, 2}).describe(hosts) ==
        "mesh dp=2 x tp=2: tp groups [0 1] on node-a, [2 3] on node-b");
  const std::vector<std::string> three = {"node-a", "node-a", "node-a",
                                          "node-b", "node-b", "node-b"};
  CHECK(place_mesh(three, {3, 2}).describe(three) ==
        "mesh dp=3 x tp=2: tp groups [0 1] on node-a, [2 3] spans node-a,node-b, [4 5] on node-b");
  const std::vector<std::string> mixed = {"x", "y", "x", "y"};
  CHECK(place_mesh(mixed, {1, 4}).describe(mixed) ==
        "mesh dp=1 x tp=4: tp groups [0 2 1 3] spans x,y");
  // Many groups: the line lists sixteen and counts the rest.
  const std::vector<std::string> many(20, "h");
  const std::string line = place_mesh(many, {20, 1}).describe(many);
  CHECK_THAT(line, Catch::StartsWith("mesh dp=20 x tp=1: tp groups [0] on h, [1] on h") &&
                       Catch::Contains("[15] on h, ... (4 more)"));
  CHECK(line.find("[16]") == std::string::npos);
}
