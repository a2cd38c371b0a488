// Tests of numa_binding.hpp: torch's four modes computed on hwloc XML topologies of GPU boxes
// (tests/data/topologies, made by make_topologies.py) and on synthetic ones without GPUs; the
// intersection with ddprun's own CPUs, the single-node no-op and the errors that name the flag.
#include <catch2/catch.hpp>

#include <sched.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ddp/launch/numa_binding.hpp"
#include "ddp/proto/error.hpp"
#include "support/skip.hpp"

using namespace ddp::launch;

namespace {

std::string topo_file(const std::string& name) {
  return std::string(DDP_SOURCE_DIR) + "/tests/data/topologies/" + name;
}

// The 8 GPUs of gpu_box_2s8g.xml and snc_box_2s8g.xml, in CUDA's (bus id) order.
const std::vector<std::string> kEight = {"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0",
                                         "0000:4e:00.0", "0000:87:00.0", "0000:90:00.0",
                                         "0000:b7:00.0", "0000:bd:00.0"};

std::vector<int> range(int lo, int hi) {  // [lo, hi]
  std::vector<int> out;
  for (int i = lo; i <= hi; ++i) out.push_back(i);
  return out;
}

std::vector<int> join(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

std::vector<std::string> cpu_lists(const NumaPlan& p) {
  std::vector<std::string> out;
  for (const auto& r : p.ranks) out.push_back(cpu_list_text(r.cpus));
  return out;
}

using Lists = std::vector<std::string>;

}  // namespace

TEST_CASE("numa: modes and CPU lists parse and print", "[unit][numa]") {
  CHECK(parse_numa_mode("node") == NumaMode::node);
  CHECK(parse_numa_mode("socket") == NumaMode::socket);
  CHECK(parse_numa_mode("exclusive") == NumaMode::exclusive);
  CHECK(parse_numa_mode("core-complex") == NumaMode::core_complex);
  CHECK_THROWS_WITH(parse_numa_mode("core_complex"),
                    Catch::Contains("--numa-binding 'core_complex' is not one of"));
  CHECK(cpu_list_text({0, 1, 2, 3, 32, 33, 34, 35}) == "0-3,32-35");
  CHECK(cpu_list_text({1, 3, 4, 7}) == "1,3-4,7");
  CHECK(cpu_list_text({}).empty());
}

TEST_CASE("numa: node and socket on a 2-socket box with 8 GPUs", "[unit][numa]") {
  const auto box = Topology::from_xml(topo_file("gpu_box_2s8g.xml"));
  const auto all = range(0, 63);
  const auto node = plan_numa_binding(box, NumaMode::node, kEight, 8, all);
  const std::string s0 = "0-15,32-47", s1 = "16-31,48-63";
  CHECK(cpu_lists(node) == Lists{s0, s0, s0, s0, s1, s1, s1, s1});
  CHECK(node.ranks[3].numa_node == 0);
  CHECK(node.ranks[4].numa_node == 1);
  CHECK(node.ranks[4].mem_node == 1);  // memory preferred from the GPU's node
  CHECK(node.note.empty());
  // One NUMA node per socket: socket is node.
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::socket, kEight, 8, all)) == cpu_lists(node));
  // Fewer ranks than GPUs: rank r still takes GPU r.
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::node, kEight, 2, all)) == Lists{s0, s0});

  // Sub-NUMA clusters: socket takes both nodes of the GPU's package, node only its own.
  const auto snc = Topology::from_xml(topo_file("snc_box_2s8g.xml"));
  CHECK(cpu_lists(plan_numa_binding(snc, NumaMode::node, kEight, 8, all)) ==
        Lists{"0-7,32-39", "0-7,32-39", "8-15,40-47", "8-15,40-47", "16-23,48-55", "16-23,48-55",
              "24-31,56-63", "24-31,56-63"});
  CHECK(cpu_lists(plan_numa_binding(snc, NumaMode::socket, kEight, 8, all)) ==
        Lists{s0, s0, s0, s0, s1, s1, s1, s1});
}

TEST_CASE("numa: exclusive splits a node's physical cores among its GPUs", "[unit][numa]") {
  const auto box = Topology::from_xml(topo_file("gpu_box_2s8g.xml"));
  // 16 cores, 4 GPUs per node: 4 cores each, both hyperthreads (siblings N and N+32).
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::exclusive, kEight, 8, range(0, 63))) ==
        Lists{"0-3,32-35", "4-7,36-39", "8-11,40-43", "12-15,44-47", "16-19,48-51", "20-23,52-55",
              "24-27,56-59", "28-31,60-63"});
  // 6 cores left on node 0 by ddprun's affinity: the first two GPUs get one core more.
  const auto six = join(join(range(0, 5), range(32, 37)), join(range(16, 31), range(48, 63)));
  const auto p = plan_numa_binding(box, NumaMode::exclusive, kEight, 4, six);
  CHECK(cpu_lists(p) == Lists{"0-1,32-33", "2-3,34-35", "4,36", "5,37"});
  // Only one PU of a core allowed: the core still counts once.
  const auto half = join(range(0, 3), range(16, 31));
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::exclusive, kEight, 4, half)) ==
        Lists{"0", "1", "2", "3"});
  // Fewer cores than GPUs on the node: torch's error, naming the flag.
  const auto two = join(join(range(0, 1), range(32, 33)), range(16, 31));
  CHECK_THROWS_AS(plan_numa_binding(box, NumaMode::exclusive, kEight, 8, two), ddp::ConfigError);
  CHECK_THROWS_WITH(plan_numa_binding(box, NumaMode::exclusive, kEight, 8, two),
                    Catch::Contains("--numa-binding=exclusive: NUMA node 0 has 2 physical cores") &&
                        Catch::Contains("4 GPUs or ranks"));
}

TEST_CASE("numa: core-complex gives each GPU its own L3 group", "[unit][numa]") {
  const auto box = Topology::from_xml(topo_file("gpu_box_2s8g.xml"));
  const std::string l0 = "0-7,32-39", l1 = "8-15,40-47", l2 = "16-23,48-55", l3 = "24-31,56-63";
  // 2 L3 groups, 4 GPUs per node: the node's i-th GPU takes group i mod 2.
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::core_complex, kEight, 8, range(0, 63))) ==
        Lists{l0, l1, l0, l1, l2, l3, l2, l3});
  // The group with more usable CPUs comes first.
  const auto some = join(range(4, 31), range(32, 63));
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::core_complex, kEight, 2, some)) ==
        Lists{l1, "4-7,32-39"});
  // No cache in the topology: nothing to group by.
  const auto flat = Topology::synthetic("pack:2 [numa] core:2 pu:1");
  CHECK_THROWS_WITH(plan_numa_binding(flat, NumaMode::core_complex, {}, 2, range(0, 3)),
                    Catch::Contains("--numa-binding=core-complex: hwloc lists no CPU cache"));
}

TEST_CASE("numa: never a CPU outside ddprun's own affinity", "[unit][numa]") {
  const auto box = Topology::from_xml(topo_file("gpu_box_2s8g.xml"));
  const auto p = plan_numa_binding(box, NumaMode::node, kEight, 4, {1, 2, 33, 40, 20});
  CHECK(cpu_lists(p) == Lists{"1-2,33,40", "1-2,33,40", "1-2,33,40", "1-2,33,40"});
  // A GPU whose node has none of ddprun's CPUs: torch's "non-empty set" error.
  CHECK_THROWS_WITH(plan_numa_binding(box, NumaMode::node, kEight, 8, range(0, 15)),
                    Catch::Contains("--numa-binding=node: local rank 4 belongs to NUMA node 1, "
                                    "which has none of ddprun's CPUs (0-15)"));
}

TEST_CASE("numa: GPUs that cannot be bound are errors naming the flag", "[unit][numa]") {
  const auto box = Topology::from_xml(topo_file("gpu_box_2s8g.xml"));
  const std::vector<std::string> two = {kEight[0], kEight[4]};
  CHECK_THROWS_WITH(plan_numa_binding(box, NumaMode::node, two, 4, range(0, 63)),
                    Catch::Contains("--numa-binding=node: local rank 2 has no GPU of its own (2 "
                                    "visible, 4 local ranks)"));
  CHECK_THROWS_WITH(plan_numa_binding(box, NumaMode::socket, {"0000:3b:00.0"}, 1, range(0, 63)),
                    Catch::Contains("hwloc does not list visible GPU 0 (PCI 0000:3b:00.0)"));
  // Only the visible GPUs count: GPU 4 alone is CUDA device 0.
  CHECK(cpu_lists(plan_numa_binding(box, NumaMode::node, {kEight[4]}, 1, range(0, 63))) ==
        Lists{"16-31,48-63"});
}

TEST_CASE("numa: without GPUs, local ranks are spread over the NUMA nodes", "[unit][numa]") {
  // 2 packages x 1 node x 2 L3 x 2 cores x 2 PUs: node 0 = PUs 0-7, node 1 = PUs 8-15.
  const auto two = Topology::synthetic("pack:2 [numa] l3:2 core:2 pu:2");
  const auto all = range(0, 15);
  CHECK(cpu_lists(plan_numa_binding(two, NumaMode::node, {}, 4, all)) ==
        Lists{"0-7", "0-7", "8-15", "8-15"});
  CHECK(cpu_lists(plan_numa_binding(two, NumaMode::node, {}, 3, all)) ==
        Lists{"0-7", "0-7", "8-15"});
  CHECK(cpu_lists(plan_numa_binding(two, NumaMode::exclusive, {}, 4, all)) ==
        Lists{"0-3", "4-7", "8-11", "12-15"});
  CHECK(cpu_lists(plan_numa_binding(two, NumaMode::core_complex, {}, 4, all)) ==
        Lists{"0-3", "4-7", "8-11", "12-15"});  // an L3 (2 cores) each
  const auto p = plan_numa_binding(two, NumaMode::node, {}, 2, all);
  CHECK(p.ranks[1].mem_node == 1);
  // A node without any of ddprun's CPUs takes no rank.
  CHECK(cpu_lists(plan_numa_binding(two, NumaMode::node, {}, 2, range(8, 15))) ==
        Lists{"8-15", "8-15"});
  // 4 nodes, 2 per package: socket binds a rank to both nodes of its package.
  const auto snc = Topology::synthetic("pack:2 group:2 [numa] core:2 pu:2");
  CHECK(cpu_lists(plan_numa_binding(snc, NumaMode::socket, {}, 2, all)) == Lists{"0-7", "8-15"});
  CHECK(cpu_lists(plan_numa_binding(snc, NumaMode::node, {}, 4, all)) ==
        Lists{"0-3", "4-7", "8-11", "12-15"});
}

TEST_CASE("numa: one NUMA node: node and socket change nothing, and say so", "[unit][numa]") {
  const auto one = Topology::synthetic("pack:1 l3:2 core:2 pu:1");
  const auto all = range(0, 3);
  const auto p = plan_numa_binding(one, NumaMode::node, {}, 2, all);
  CHECK(cpu_lists(p) == Lists{"0-3", "0-3"});
  CHECK(p.ranks[0].mem_node == -1);
  CHECK_THAT(p.note, Catch::Contains("--numa-binding=node: hwloc finds a single NUMA node") &&
                         Catch::Contains("(0-3)"));
  CHECK_FALSE(plan_numa_binding(one, NumaMode::socket, {}, 2, all).note.empty());
  // exclusive and core-complex still split the one node.
  const auto ex = plan_numa_binding(one, NumaMode::exclusive, {}, 2, all);
  CHECK(cpu_lists(ex) == Lists{"0-1", "2-3"});
  CHECK(ex.note.empty());
  CHECK(cpu_lists(plan_numa_binding(one, NumaMode::core_complex, {}, 2, all)) ==
        Lists{"0-1", "2-3"});
}

TEST_CASE("numa: topologies that cannot be loaded are config errors", "[unit][numa]") {
  CHECK_THROWS_AS(Topology::from_xml(topo_file("no_such_file.xml")), ddp::ConfigError);
  CHECK_THROWS_AS(Topology::synthetic("pack:two"), ddp::ConfigError);
  CHECK(own_cpus().size() >= 1);
}

TEST_CASE("numa: the agent's side reads DDPRUN_HWLOC_XML and its own CPUs", "[unit][numa]") {
  const EnvMap env = {{"DDPRUN_HWLOC_XML", topo_file("two_pu_2s2g.xml")},
                      {"DDPRUN_NVIDIA_GPUS_DIR", topo_file("no_gpus_here")}};
  // The agent binds within its own affinity: pin this test's thread to CPUs 0-1 (the
  // topology's two PUs) for the check, and give the old mask back after it.
  cpu_set_t before;
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  cpu_set_t pair;
  CPU_ZERO(&pair);
  CPU_SET(0, &pair);
  CPU_SET(1, &pair);
  if (sched_setaffinity(0, sizeof pair, &pair) != 0 || own_cpus() != std::vector<int>{0, 1}) {
    sched_setaffinity(0, sizeof before, &before);
    DDP_SKIP("CPUs 0 and 1 are not both allowed to this process (a cpuset without them)");
  }
  struct Restore {
    cpu_set_t mask;
    ~Restore() { sched_setaffinity(0, sizeof mask, &mask); }
  } restore{before};
  const auto b = numa_bindings_for_round("node", 2, env);
  REQUIRE(b.size() == 2);
  CHECK(b[0].cpus == std::vector<int>{0});
  CHECK(b[1].cpus == std::vector<int>{1});
  CHECK(b[1].mem_node == 1);
  CHECK_THROWS_AS(numa_bindings_for_round("sockets", 2, env), ddp::ConfigError);
}
