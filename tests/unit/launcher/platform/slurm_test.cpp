// Slurm's host lists and counts, expanded as scontrol show hostnames would.
#include "ddp/launch/slurm.hpp"

#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"

using ddp::launch::expand_counts;
using ddp::launch::expand_hostlist;
using V = std::vector<std::string>;

TEST_CASE("host lists: ranges, padding, several groups, several items", "[unit][slurm]") {
  CHECK(expand_hostlist("node1") == V{"node1"});
  CHECK(expand_hostlist("n[1-3,7]") == V{"n1", "n2", "n3", "n7"});
  CHECK(expand_hostlist("gpu-[01-04]") == V{"gpu-01", "gpu-02", "gpu-03", "gpu-04"});
  CHECK(expand_hostlist("gpu-[098-101]") == V{"gpu-098", "gpu-099", "gpu-100", "gpu-101"});
  CHECK(expand_hostlist("a,b[5-6],c") == V{"a", "b5", "b6", "c"});
  CHECK(expand_hostlist("rack[1-2]-n[01-02]") ==
        V{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"});
  CHECK(expand_hostlist("n[3]") == V{"n3"});
  CHECK(expand_hostlist("c[1-2]x") == V{"c1x", "c2x"});
}

TEST_CASE("host lists: malformed ones are named, huge ones refused", "[unit][slurm]") {
  for (const char* badlist :
       {"", "n[1-3", "n1-3]", "n[[1]]", "n[3-1]", "n[a-b]", "n[1,]", "a,,b", "n[]"}) {
    CAPTURE(badlist);
    CHECK_THROWS_AS(expand_hostlist(badlist), ddp::ConfigError);
  }
  CHECK_THROWS_WITH(expand_hostlist("n[3-1]"),
                    Catch::Contains("n[3-1]") && Catch::Contains("backwards"));
  CHECK_THROWS_WITH(expand_hostlist("n[0-99999999]"), Catch::Contains("more than"));
  CHECK_THROWS_WITH(expand_hostlist("a[0-999]b[0-999]c[0-999]", 10000),
                    Catch::Contains("more than"));
}

TEST_CASE("counts: N and N(xR), as in SLURM_TASKS_PER_NODE", "[unit][slurm]") {
  CHECK(expand_counts("4") == std::vector<int>{4});
  CHECK(expand_counts("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_counts("1,8(x2)") == std::vector<int>{1, 8, 8});
  for (const char* badlist : {"", "x", "2(x)", "2(3)", "2(x3", "2,,1", "2(x99999999)"}) {
    CAPTURE(badlist);
    CHECK_THROWS_AS(expand_counts(badlist), ddp::ConfigError);
  }
}
