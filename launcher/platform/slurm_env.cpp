// ddprun's defaults from Slurm's environment, and the stop grace under KillWait (see
// slurm_env.hpp and docs/slurm.md for the rules and why).
#include "ddp/launch/slurm_env.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>

#include "ddp/launch/slurm.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::launch {
namespace {

using Env = std::map<std::string, std::string>;

const std::string* find(const Env& env, std::initializer_list<const char*> names,
                        std::string* which = nullptr) {
  for (const char* n : names) {
    auto it = env.find(n);
    if (it != env.end() && !it->second.empty()) {
      if (which) *which = n;
      return &it->second;
    }
  }
  return nullptr;
}

int integer(const std::string& name, const std::string& text, int min) {
  return static_cast<int>(parse_int(text, name + " (from Slurm)", min, 1 << 30));
}
int positive(const std::string& name, const std::string& text) { return integer(name, text, 1); }

// expand_counts, with the variable named in its error.
std::vector<int> named_counts(const std::string& name, const std::string& text) {
  try {
    return expand_counts(text);
  } catch (const ConfigError& e) {
    throw ConfigError(name + " (from Slurm): " + e.what());
  }
}

std::size_t count_items(const std::string& list) {
  return static_cast<std::size_t>(std::count(list.begin(), list.end(), ',')) + 1;
}

// Workers per node: the GPUs Slurm gave this task, or in a one-node batch script its tasks
// per node. Empty when Slurm says nothing about it.
std::optional<int> workers_per_node(const Env& env, bool in_step) {
  if (find(env, {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"})) {
    // --gpus-per-task narrows CUDA_VISIBLE_DEVICES but leaves SLURM_GPUS_ON_NODE at the
    // node's count: what this task can use is CUDA_VISIBLE_DEVICES.
    if (const auto* cvd = find(env, {"CUDA_VISIBLE_DEVICES"})) {
      return static_cast<int>(count_items(*cvd));
    }
    if (const auto* g = find(env, {"SLURM_GPUS_ON_NODE"})) {
      int n = integer("SLURM_GPUS_ON_NODE", *g, 0);
      if (n > 0) return n;
    }
  }
  if (!in_step) {
    if (const auto* t = find(env, {"SLURM_NTASKS_PER_NODE"})) {
      return positive("SLURM_NTASKS_PER_NODE", *t);
    }
    if (const auto* t = find(env, {"SLURM_TASKS_PER_NODE"})) {  // --ntasks without per-node
      return named_counts("SLURM_TASKS_PER_NODE", *t).front();
    }
  }
  return std::nullopt;
}

// Runs one derivation; a malformed SLURM_* value becomes a problem for `flag`, raised only if
// the command line does not give that flag.
template <typename F>
void derive(SlurmDefaults& d, const std::string& flag, F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    d.problems[flag] = e.what();
  }
}

}  // namespace

SlurmDefaults slurm_defaults(const Env& env) {
  SlurmDefaults d;
  const std::string* job = find(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) return d;
  d.active = true;
  const std::string* step = find(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  d.in_step = step != nullptr;
  d.job = *job + (step ? "." + *step : "");

  derive(d, "--nproc-per-node", [&] {
    if (auto n = workers_per_node(env, d.in_step)) {
      d.args.push_back("--nproc-per-node=" + std::to_string(*n));
    }
  });

  std::string list_name;
  const std::string* list =
      d.in_step
          ? find(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_name)
          : find(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_name);
  std::vector<std::string> hosts;
  if (!list) {
    d.endpoint_problem = d.in_step ? "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set"
                                   : "SLURM_JOB_NODELIST is not set";
  } else {
    try {
      hosts = expand_hostlist(*list);
      d.first_host = hosts.front();
    } catch (const ConfigError& e) {
      d.endpoint_problem = list_name + ": " + e.what();
    }
  }

  if (d.in_step) {
    derive(d, "--nnodes", [&] {
      std::string name;
      if (const auto* n =
              find(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, &name)) {
        d.args.push_back("--nnodes=" + std::to_string(positive(name, *n)));
      }
    });
    // The node rank: this node's place in the step's node list (right even when the step runs
    // on part of the job's nodes), else SLURM_NODEID.
    int rank = -1;
    if (const auto* me = find(env, {"SLURMD_NODENAME"})) {
      auto it = std::find(hosts.begin(), hosts.end(), *me);
      if (it != hosts.end()) rank = static_cast<int>(it - hosts.begin());
    }
    derive(d, "--node-rank", [&] {
      if (const auto* id = find(env, {"SLURM_NODEID"}); id && rank < 0) {
        rank = integer("SLURM_NODEID", *id, 0);
      }
      if (rank >= 0) d.args.push_back("--node-rank=" + std::to_string(rank));
    });
    // One agent per node: several ddprun tasks on a node would each start the node's workers.
    // SLURM_GTIDS lists this node's tasks; else SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at this
    // node's place in the step.
    derive(d, "--nnodes", [&] {
      std::size_t tasks = 1;
      std::string why;
      if (const auto* gtids = find(env, {"SLURM_GTIDS"})) {
        tasks = count_items(*gtids);
        why = "SLURM_GTIDS=" + *gtids;
      } else if (const auto* per = find(env, {"SLURM_STEP_TASKS_PER_NODE"}); per && rank >= 0) {
        auto counts = named_counts("SLURM_STEP_TASKS_PER_NODE", *per);
        if (static_cast<std::size_t>(rank) < counts.size()) {
          tasks = static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]);
        }
        why = "SLURM_STEP_TASKS_PER_NODE=" + *per;
      }
      if (tasks > 1) {
        d.layout_problem = "srun started " + std::to_string(tasks) +
                           " ddprun tasks on this node (" + why +
                           "), but ddprun is one agent per node that starts the node's "
                           "workers itself: run it as `srun --ntasks-per-node=1 "
                           "--ntasks=$SLURM_NNODES ddprun ...` (or give --nnodes to override)";
      }
    });
  } else {
    derive(d, "--nnodes", [&] {
      const auto* nodes = find(env, {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
      int n = nodes ? positive("SLURM_NNODES", *nodes) : 1;
      if (n > 1) {
        d.layout_problem =
            "ddprun runs in the batch script of a " + std::to_string(n) +
            "-node job, which runs on its first node only: start one ddprun per node with "
            "`srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES ddprun ...` (or give --nnodes to "
            "override)";
      }
    });
  }
  d.args.push_back("--rdzv-id=" + d.job);
  return d;
}

std::optional<int> parse_kill_wait(std::string_view conf) {
  std::optional<int> found;
  std::istringstream in{std::string(conf)};
  std::string line;
  while (std::getline(in, line)) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    line.erase(0, start);
    constexpr std::string_view kKey = "killwait";
    if (line.size() <= kKey.size()) continue;
    std::string key = line.substr(0, kKey.size());
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    auto rest = line.find_first_not_of(" \t", kKey.size());
    if (key != kKey || rest == std::string::npos || line[rest] != '=') continue;
    std::string value = line.substr(rest + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    int v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec == std::errc() && end == value.data() + value.size() && v >= 0) found = v;
  }
  return found;
}

std::chrono::milliseconds stop_grace(std::chrono::milliseconds configured,
                                     std::optional<int> kill_wait_s) {
  if (!kill_wait_s) return configured;
  using std::chrono::milliseconds;
  const milliseconds kill_wait(static_cast<long>(*kill_wait_s) * 1000);
  milliseconds cap = kill_wait - std::max(milliseconds(1000), kill_wait / 10);
  cap = std::max(cap, milliseconds(500));
  return std::min(configured, cap);
}

}  // namespace ddp::launch
