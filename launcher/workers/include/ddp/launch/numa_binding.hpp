// --numa-binding: the CPUs (and memory nodes) each local rank is bound to, with torch's modes
// (node, socket, exclusive, core-complex), computed from the hwloc topology.
//
// torch's rules (torch/numa/binding.py), with hwloc in place of sysfs: local rank r belongs to
// visible GPU r, and that GPU to the NUMA node hwloc places it under (the lowest-numbered one
// when hwloc places it above several). The CPUs of a node are those hwloc lists for it AND in
// ddprun's own affinity (sched_getaffinity: taskset, Slurm's cpuset), never more.
//   node:         every CPU of the GPU's NUMA node.
//   socket:       every CPU of the NUMA nodes whose first CPU is in the same package as the
//                 first CPU of the GPU's node.
//   exclusive:    the node's physical cores (all their PUs), split evenly in order among the
//                 node's GPUs (the first ones get one more when it does not divide); fewer
//                 cores than GPUs is an error.
//   core-complex: the node's CPUs grouped by their highest-level data cache (L3), largest
//                 group first; the node's i-th GPU takes group i mod the number of groups.
// ddprun's additions: with no visible GPU, local rank r takes NUMA node (r * N / nproc) among
// the N nodes that have CPUs ddprun may use, and the modes apply to those shares; each worker's
// memory is preferred (MPOL_PREFERRED) from its NUMA node when there are several. Errors
// (a rank without a GPU, a GPU hwloc does not list, no CPU left) are ConfigErrors naming
// --numa-binding: ddprun exits 2 before any worker starts, where torchrun fails its launch.
#pragma once

#include <string>
#include <vector>

#include "ddp/launch/worker_env.hpp"

struct hwloc_topology;

namespace ddp::launch {

enum class NumaMode { node, socket, exclusive, core_complex };

// "node", "socket", "exclusive" or "core-complex"; anything else throws ConfigError.
NumaMode parse_numa_mode(const std::string& text);
const char* numa_mode_name(NumaMode mode);

// An hwloc topology, loaded and owned. Load failures throw ConfigError.
class Topology {
 public:
  static Topology this_machine(bool with_pci);
  static Topology from_xml(const std::string& path);          // PCI devices included
  static Topology synthetic(const std::string& description);  // e.g. "pack:2 [numa] core:4 pu:2"
  Topology(Topology&& other) noexcept;
  Topology& operator=(Topology&&) = delete;
  Topology(const Topology&) = delete;
  ~Topology();
  hwloc_topology* get() const { return t_; }

 private:
  explicit Topology(hwloc_topology* t) : t_(t) {}
  hwloc_topology* t_;
};

struct RankBinding {
  std::vector<int> cpus;  // OS indexes, sorted (never empty in a plan)
  int mem_node = -1;      // the NUMA node (OS index) memory is preferred from; -1: default
  int numa_node = -1;     // the NUMA node the rank's GPU (or share) belongs to
};

struct NumaPlan {
  std::vector<RankBinding> ranks;  // one per local rank
  std::string note;                // a line for stderr (binding changes nothing), or ""
};

// Pure over the topology: the binding of each of `local_world_size` ranks. `gpu_bus_ids` are the
// visible GPUs in CUDA's order ("0000:3b:00.0"; empty: none), `allowed_cpus` ddprun's own CPUs.
// Throws ConfigError (see above).
NumaPlan plan_numa_binding(const Topology& topology, NumaMode mode,
                           const std::vector<std::string>& gpu_bus_ids, int local_world_size,
                           const std::vector<int>& allowed_cpus);

// The agent's side, once per round: the topology (DDPRUN_HWLOC_XML, else this machine), the
// visible GPUs (gpu_devices.hpp), ddprun's affinity; prints the plan's note. A rank whose CPUs
// are all of ddprun's gets no CPU binding (cpus empty).
std::vector<RankBinding> numa_bindings_for_round(const std::string& mode, int nproc,
                                                 const EnvMap& agent_env);

// ddprun's own CPUs (sched_getaffinity), sorted.
std::vector<int> own_cpus();

// "0-3,32-35", as numactl and sysfs write CPU lists.
std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace ddp::launch
