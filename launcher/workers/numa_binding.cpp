// See numa_binding.hpp. torch reads sysfs (cpulist, thread_siblings_list, cache/index*); the
// same facts come here from hwloc's objects, so a saved or synthetic topology can stand in.
#include "ddp/launch/numa_binding.hpp"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "ddp/launch/gpu_devices.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"

namespace ddp::launch {
namespace {

using Cpus = std::set<int>;

Cpus to_set(hwloc_const_bitmap_t b) {
  Cpus out;
  if (b == nullptr) return out;
  for (int i = hwloc_bitmap_first(b); i >= 0; i = hwloc_bitmap_next(b, i)) out.insert(i);
  return out;
}

Cpus intersect(const Cpus& a, const Cpus& b) {
  Cpus out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

hwloc_topology_t new_topology() {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) throw ConfigError("--numa-binding: hwloc cannot start");
  return t;
}

// PCI devices (GPUs are "important"), but no OS devices: hwloc's CUDA/NVML plugins, where
// installed, then never initialize a GPU library inside ddprun.
void keep_pci(hwloc_topology_t t) {
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  hwloc_topology_set_type_filter(t, HWLOC_OBJ_OS_DEVICE, HWLOC_TYPE_FILTER_KEEP_NONE);
}

void load(hwloc_topology_t t, const std::string& what) {
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    throw ConfigError("--numa-binding: hwloc cannot load " + what);
  }
}

// The facts of one topology the modes need, read once.
class View {
 public:
  View(hwloc_topology_t t, const Cpus& allowed, const std::string& flag) : t_(t), flag_(flag) {
    hwloc_obj_t o = nullptr;
    while ((o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, o)) != nullptr) {
      nodes_[static_cast<int>(o->os_index)] = intersect(to_set(o->cpuset), allowed);
    }
  }
  std::size_t node_count() const { return nodes_.size(); }
  const std::map<int, Cpus>& nodes() const { return nodes_; }

  // torch's _get_allowed_logical_cpu_indices_for_numa_node.
  const Cpus& node_cpus(int node) const {
    static const Cpus none;
    auto it = nodes_.find(node);
    return it == nodes_.end() ? none : it->second;
  }

  // The NUMA node hwloc places the PCI device under (torch: /sys/bus/pci/.../numa_node, -1 -> 0).
  int gpu_node(const std::string& bus_id, std::size_t index) const {
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t_, bus_id.c_str());
    if (dev == nullptr) {
      throw ConfigError(flag_ + ": hwloc does not list visible GPU " + std::to_string(index) +
                        " (PCI " + bus_id + ")");
    }
    hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(t_, dev);
    const int first = near ? hwloc_bitmap_first(near->nodeset) : -1;
    if (first >= 0 && nodes_.count(first)) return first;
    return nodes_.empty() ? 0 : nodes_.begin()->first;
  }

  // The package of a CPU (torch: topology/physical_package_id); -1 when hwloc has none.
  int package_of(int cpu) const {
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t_, static_cast<unsigned>(cpu));
    hwloc_obj_t pkg = pu ? hwloc_get_ancestor_obj_by_type(t_, HWLOC_OBJ_PACKAGE, pu) : nullptr;
    return pkg ? static_cast<int>(pkg->logical_index) : -1;
  }

  // The lowest CPU of the physical core (torch: min of thread_siblings_list).
  int core_key(int cpu) const {
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t_, static_cast<unsigned>(cpu));
    hwloc_obj_t core = pu ? hwloc_get_ancestor_obj_by_type(t_, HWLOC_OBJ_CORE, pu) : nullptr;
    hwloc_obj_t o = core ? core : pu;
    return o ? hwloc_bitmap_first(o->cpuset) : cpu;
  }

  // The lowest CPU sharing the highest-level data/unified cache (torch: cache/index*/level).
  int cache_key(int cpu) const {
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t_, static_cast<unsigned>(cpu));
    hwloc_obj_t best = nullptr;
    for (hwloc_obj_t o = pu ? pu->parent : nullptr; o != nullptr; o = o->parent) {
      if (hwloc_obj_type_is_dcache(o->type) &&
          (best == nullptr || o->attr->cache.depth > best->attr->cache.depth)) {
        best = o;
      }
    }
    if (best == nullptr) {
      throw ConfigError(flag_ + ": hwloc lists no CPU cache above CPU " + std::to_string(cpu) +
                        ", so there are no core complexes to bind to");
    }
    return hwloc_bitmap_first(best->cpuset);
  }

 private:
  hwloc_topology_t t_;
  std::string flag_;
  std::map<int, Cpus> nodes_;  // OS index -> CPUs ddprun may use
};

std::vector<int> to_vector(const Cpus& s) { return {s.begin(), s.end()}; }

// exclusive: the node's cores, in order of their lowest CPU, split among its devices.
Cpus exclusive_share(const View& v, int node, const Cpus& cpus, std::size_t devices,
                     std::size_t relative, const std::string& flag) {
  std::map<int, Cpus> cores;
  for (int cpu : cpus) cores[v.core_key(cpu)].insert(cpu);
  const std::size_t per = cores.size() / devices;
  const std::size_t extra = cores.size() % devices;
  if (per < 1) {
    throw ConfigError(flag + ": NUMA node " + std::to_string(node) + " has " +
                      std::to_string(cores.size()) + " physical cores ddprun may use (CPUs " +
                      cpu_list_text(to_vector(cpus)) + ") but " + std::to_string(devices) +
                      " GPUs or ranks to share them; exclusive needs a core for each");
  }
  const std::size_t start = relative * per + std::min(relative, extra);
  const std::size_t end = start + per + (relative < extra ? 1 : 0);
  Cpus out;
  std::size_t i = 0;
  for (const auto& [key, members] : cores) {
    if (i >= start && i < end) out.insert(members.begin(), members.end());
    ++i;
  }
  return out;
}

// core-complex: groups sharing the highest-level cache, largest first, then by lowest CPU.
Cpus complex_share(const View& v, const Cpus& cpus, std::size_t relative) {
  std::map<int, Cpus> groups;
  for (int cpu : cpus) groups[v.cache_key(cpu)].insert(cpu);
  std::vector<std::pair<int, Cpus>> order(groups.begin(), groups.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second.size() > b.second.size();  // keys already ascending
  });
  return order[relative % order.size()].second;
}

Cpus socket_cpus(const View& v, const Cpus& own_node_cpus) {
  const int socket = v.package_of(*own_node_cpus.begin());
  Cpus out;
  for (const auto& [node, cpus] : v.nodes()) {
    if (!cpus.empty() && v.package_of(*cpus.begin()) == socket)
      out.insert(cpus.begin(), cpus.end());
  }
  return out;
}

}  // namespace

NumaMode parse_numa_mode(const std::string& text) {
  if (text == "node") return NumaMode::node;
  if (text == "socket") return NumaMode::socket;
  if (text == "exclusive") return NumaMode::exclusive;
  if (text == "core-complex") return NumaMode::core_complex;
  throw ConfigError("--numa-binding '" + text +
                    "' is not one of node, socket, exclusive, core-complex");
}

const char* numa_mode_name(NumaMode mode) {
  switch (mode) {
    case NumaMode::node: return "node";
    case NumaMode::socket: return "socket";
    case NumaMode::exclusive: return "exclusive";
    case NumaMode::core_complex: return "core-complex";
  }
  return "?";
}

Topology Topology::this_machine(bool with_pci) {
  hwloc_topology_t t = new_topology();
  if (with_pci) keep_pci(t);
  load(t, "this machine's topology");
  return Topology(t);
}

Topology Topology::from_xml(const std::string& path) {
  hwloc_topology_t t = new_topology();
  keep_pci(t);
  if (hwloc_topology_set_xml(t, path.c_str()) != 0) {
    hwloc_topology_destroy(t);
    throw ConfigError("--numa-binding: hwloc cannot read the XML topology '" + path + "'");
  }
  load(t, "the XML topology '" + path + "'");
  return Topology(t);
}

Topology Topology::synthetic(const std::string& description) {
  hwloc_topology_t t = new_topology();
  if (hwloc_topology_set_synthetic(t, description.c_str()) != 0) {
    hwloc_topology_destroy(t);
    throw ConfigError("--numa-binding: bad synthetic topology '" + description + "'");
  }
  load(t, "the synthetic topology '" + description + "'");
  return Topology(t);
}

Topology::Topology(Topology&& other) noexcept : t_(std::exchange(other.t_, nullptr)) {}

Topology::~Topology() {
  if (t_ != nullptr) hwloc_topology_destroy(t_);
}

NumaPlan plan_numa_binding(const Topology& topology, NumaMode mode,
                           const std::vector<std::string>& gpu_bus_ids, int local_world_size,
                           const std::vector<int>& allowed_cpus) {
  const std::string flag = std::string("--numa-binding=") + numa_mode_name(mode);
  const Cpus allowed(allowed_cpus.begin(), allowed_cpus.end());
  const std::vector<int> all = to_vector(allowed);  // sorted
  const View v(topology.get(), allowed, flag);
  const auto ranks = static_cast<std::size_t>(std::max(local_world_size, 0));
  // The "devices" ranks are bound by: the visible GPUs, else one share per rank.
  std::vector<int> device_node;
  if (!gpu_bus_ids.empty()) {
    if (ranks > gpu_bus_ids.size()) {
      throw ConfigError(flag + ": local rank " + std::to_string(gpu_bus_ids.size()) +
                        " has no GPU of its own (" + std::to_string(gpu_bus_ids.size()) +
                        " visible, " + std::to_string(ranks) +
                        " local ranks); torch binds local rank r by GPU r");
    }
    for (std::size_t d = 0; d < gpu_bus_ids.size(); ++d) {
      device_node.push_back(v.gpu_node(gpu_bus_ids[d], d));
    }
  } else {
    std::vector<int> usable;
    for (const auto& [node, cpus] : v.nodes()) {
      if (!cpus.empty()) usable.push_back(node);
    }
    if (usable.empty()) {
      throw ConfigError(flag + ": no NUMA node has any of ddprun's CPUs (" + cpu_list_text(all) +
                        ")");
    }
    for (std::size_t r = 0; r < ranks; ++r)
      device_node.push_back(usable[r * usable.size() / ranks]);
  }

  NumaPlan plan;
  for (std::size_t r = 0; r < ranks; ++r) {
    const int node = device_node[r];
    const Cpus& cpus = v.node_cpus(node);
    if (cpus.empty()) {
      throw ConfigError(flag + ": local rank " + std::to_string(r) + " belongs to NUMA node " +
                        std::to_string(node) + ", which has none of ddprun's CPUs (" +
                        cpu_list_text(all) + ")");
    }
    std::vector<std::size_t> same_node;  // the devices of this node, in index order
    for (std::size_t d = 0; d < device_node.size(); ++d) {
      if (device_node[d] == node) same_node.push_back(d);
    }
    const auto relative = static_cast<std::size_t>(
        std::find(same_node.begin(), same_node.end(), r) - same_node.begin());
    Cpus chosen;
    switch (mode) {
      case NumaMode::node: chosen = cpus; break;
      case NumaMode::socket: chosen = socket_cpus(v, cpus); break;
      case NumaMode::exclusive:
        chosen = exclusive_share(v, node, cpus, same_node.size(), relative, flag);
        break;
      case NumaMode::core_complex: chosen = complex_share(v, cpus, relative); break;
    }
    RankBinding b;
    b.cpus = to_vector(chosen);
    b.numa_node = node;
    b.mem_node = v.node_count() > 1 ? node : -1;
    plan.ranks.push_back(std::move(b));
  }
  const bool changes = std::any_of(plan.ranks.begin(), plan.ranks.end(),
                                   [&](const RankBinding& b) { return b.cpus != all; });
  if (v.node_count() <= 1 && !changes) {
    const std::string why = ": hwloc finds a single NUMA node here, so the workers keep all of ";
    plan.note = flag + why + "ddprun's CPUs (" + cpu_list_text(all) + ")";
  }
  return plan;
}

std::vector<int> own_cpus() {
  std::vector<int> out;
  // Sized for the largest machines: CPU_ALLOC grows as the kernel needs (EINVAL: too small).
  for (int n = 1024; n <= (1 << 20); n *= 4) {
    cpu_set_t* set = CPU_ALLOC(static_cast<std::size_t>(n));
    const std::size_t size = CPU_ALLOC_SIZE(static_cast<std::size_t>(n));
    CPU_ZERO_S(size, set);
    if (::sched_getaffinity(0, size, set) == 0) {
      for (int cpu = 0; cpu < n; ++cpu) {
        if (CPU_ISSET_S(static_cast<std::size_t>(cpu), size, set)) out.push_back(cpu);
      }
      CPU_FREE(set);
      return out;
    }
    CPU_FREE(set);
  }
  throw IoError("--numa-binding: sched_getaffinity failed");
}

std::vector<RankBinding> numa_bindings_for_round(const std::string& mode_text, int nproc,
                                                 const EnvMap& agent_env) {
  const NumaMode mode = parse_numa_mode(mode_text);
  const std::string gpus_dir =
      knobs::text("DDPRUN_NVIDIA_GPUS_DIR", &agent_env).value_or("/proc/driver/nvidia/gpus");
  std::vector<std::string> bus_ids;
  for (const auto& g : visible_gpus(machine_gpus(gpus_dir), agent_env)) {
    bus_ids.push_back(g.pci_bus_id);
  }
  const auto xml = knobs::text("DDPRUN_HWLOC_XML", &agent_env);
  const Topology topology =
      xml ? Topology::from_xml(*xml) : Topology::this_machine(!bus_ids.empty());
  const std::vector<int> allowed = own_cpus();
  NumaPlan plan = plan_numa_binding(topology, mode, bus_ids, nproc, allowed);
  static bool noted = false;  // once per ddprun, not once per restart
  if (!plan.note.empty() && !noted) {
    std::fprintf(stderr, "ddprun: %s\n", plan.note.c_str());
    noted = true;
  }
  for (auto& b : plan.ranks) {
    if (b.cpus == allowed) b.cpus.clear();  // nothing to change: no sched_setaffinity
  }
  return std::move(plan.ranks);
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ddp::launch
