// Rank assignment as torch 2.x does it: contiguous per node in group-rank order, roles counted
// separately, uneven nodes allowed, inconsistent inputs refused.
#include "ddp/launch/rank_assignment.hpp"

#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;

TEST_CASE("global ranks are prefix sums in group-rank order", "[unit][launch]") {
  // given out of order, as they arrive from the store
  auto r = assign_ranks({{"default", 2, 4}, {"default", 0, 4}, {"default", 1, 2}});
  REQUIRE(r.size() == 3);
  CHECK(r[0].base_global_rank == 0);
  CHECK(r[1].base_global_rank == 4);
  CHECK(r[2].base_global_rank == 6);
  for (const auto& a : r) {
    CHECK(a.global_world_size == 10);
    CHECK(a.role_world_size == 10);
    CHECK(a.base_role_rank == a.base_global_rank);
  }
}

TEST_CASE("roles are ranked among themselves", "[unit][launch]") {
  auto r = assign_ranks({{"trainer", 0, 2}, {"reader", 1, 3}, {"trainer", 2, 2}});
  CHECK(r[2].base_global_rank == 5);
  CHECK(r[2].base_role_rank == 2);
  CHECK(r[2].role_world_size == 4);
  CHECK(r[1].base_role_rank == 0);
  CHECK(r[1].role_world_size == 3);
}

TEST_CASE("inconsistent node lists are refused", "[unit][launch]") {
  CHECK_THROWS_AS(assign_ranks({{"d", 0, 1}, {"d", 0, 1}}), ddp::ConfigError);
  CHECK_THROWS_AS(assign_ranks({{"d", 0, 1}, {"d", 2, 1}}), ddp::ConfigError);
  CHECK_THROWS_AS(assign_ranks({{"d", 0, 0}}), ddp::ConfigError);
}
