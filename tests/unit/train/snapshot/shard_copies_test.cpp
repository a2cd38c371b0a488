// copies_unusable(): when the shard copies can heal a sharded job, and why not.
#include <catch2/catch.hpp>

#include "shard_copies.hpp"

using ddp::train::copies_unusable;
using Held = std::vector<std::array<std::int64_t, 2>>;

TEST_CASE("shard copies: every shard with a copy at one step heals, at that step",
          "[unit][train][shard_copies]") {
  std::int64_t step = -7;
  CHECK(copies_unusable({{9, 9}, {9, 9}, {9, 9}}, &step).empty());
  CHECK(step == 9);
  // Rank 1 replaced: rank 2 holds its shard at 9.
  CHECK(copies_unusable({{9, 9}, {-1, -1}, {9, 9}}, &step).empty());
  CHECK(step == 9);
  // The last rank replaced: rank 0 (its successor, around the ring) holds it.
  CHECK(copies_unusable({{4, 4}, {4, 4}, {-1, -1}}, &step).empty());
  // Two replaced ranks that are not neighbours.
  CHECK(copies_unusable({{-1, -1}, {6, 6}, {-1, -1}, {6, 6}}, &step).empty());
  CHECK(step == 6);
}

TEST_CASE("shard copies: what cannot heal is named", "[unit][train][shard_copies]") {
  std::int64_t step = -7;
  CHECK(copies_unusable({{-1, -1}, {-1, -1}}, &step) == "no rank holds a copy");
  CHECK(copies_unusable({{3, 3}, {-1, -1}, {-1, -1}}, &step) ==
        "rank 1's shard has no copy: its holder, rank 2, was replaced too");
  CHECK(copies_unusable({{5, 5}, {5, 4}, {-1, -1}, {5, 5}}, &step).empty());  // rank 3 holds it
  step = -7;
  CHECK(copies_unusable({{5, 5}, {-1, -1}, {5, 4}}, &step) ==
        "rank 1's shard has no copy at step 5: its holder, rank 2, has step 4");
  CHECK(copies_unusable({{5, 5}, {6, 5}}, &step) ==
        "the ranks' copies are at different steps (rank 0 at 5, rank 1 at 6)");
  CHECK(step == -7);  // untouched when it cannot heal
}
