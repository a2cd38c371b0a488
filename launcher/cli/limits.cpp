// Sanity bounds on counts and durations (see limits.hpp): pure checks with messages that name
// the flag, plus the one look at the machine (RLIMIT_NPROC and pid_max).
#include "ddp/launch/limits.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "ddp/launch/etcd_conf.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::launch {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

void check_local_rank(int r, const std::string& flag) {
  if (r < 0 || r > kMaxLocalRank) {
    throw ConfigError(flag + ": local rank " + str(r) + " is not in [0, " + str(kMaxLocalRank) +
                      "]");
  }
}

// A --rdzv-conf value that is a number of seconds: finite, in [0, kMaxSeconds].
void check_seconds(const LaunchConfig& c, const std::string& key, bool positive) {
  auto it = c.rdzv_conf.find(key);
  if (it == c.rdzv_conf.end()) return;
  const auto v = parse_seconds(it->second, "--rdzv-conf " + key, 0, kMaxSeconds);
  if (positive && v.count() <= 0) {
    throw ConfigError("--rdzv-conf " + key + " '" + it->second + "' must be more than 0 seconds");
  }
}

}  // namespace

MachineLimits read_machine_limits() {
  MachineLimits m;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    m.rlimit_nproc = static_cast<std::int64_t>(rl.rlim_cur);
  }
  std::ifstream in("/proc/sys/kernel/pid_max");
  std::int64_t pid_max = 0;
  if (in >> pid_max && pid_max > 0) m.pid_max = pid_max;
  return m;
}

int default_nproc_bound(const MachineLimits& m) {
  std::int64_t b = std::min<std::int64_t>(kDefaultNprocBound, m.pid_max / 16);
  if (m.rlimit_nproc >= 0) b = std::min(b, m.rlimit_nproc / 2);
  return static_cast<int>(std::max<std::int64_t>(1, b));
}

int hard_nproc_bound(const MachineLimits& m) {
  std::int64_t b = std::min<std::int64_t>(kNprocCeiling, m.pid_max / 2);
  if (m.rlimit_nproc >= 0) b = std::min(b, m.rlimit_nproc);
  return static_cast<int>(std::max<std::int64_t>(1, b));
}

void check_nproc(int nproc, const LaunchConfig& c, const MachineLimits& m) {
  const int hard = hard_nproc_bound(m);
  const std::string why = "min(" + str(kNprocCeiling) + ", pid_max/2 = " + str(m.pid_max / 2) +
                          (m.rlimit_nproc >= 0 ? ", RLIMIT_NPROC = " + str(m.rlimit_nproc) : "") +
                          ")";
  if (c.max_nproc_per_node && *c.max_nproc_per_node > hard) {
    throw ConfigError("--max-nproc-per-node=" + str(*c.max_nproc_per_node) +
                      " is above this machine's hard bound of " + str(hard) + " workers per node " +
                      why);
  }
  if (nproc <= 0) throw ConfigError("--nproc-per-node: need at least one worker");
  if (c.max_nproc_per_node) {
    if (nproc > *c.max_nproc_per_node) {
      throw ConfigError("--nproc-per-node=" + str(nproc) +
                        " is above --max-nproc-per-node=" + str(*c.max_nproc_per_node));
    }
  } else if (int bound = default_nproc_bound(m); nproc > bound) {
    throw ConfigError("--nproc-per-node=" + str(nproc) + " is above the default bound of " +
                      str(bound) + " workers per node on this machine (min(" +
                      str(kDefaultNprocBound) + ", pid_max/16 = " + str(m.pid_max / 16) +
                      (m.rlimit_nproc >= 0 ? ", RLIMIT_NPROC/2 = " + str(m.rlimit_nproc / 2) : "") +
                      ")); if you mean it, add --max-nproc-per-node=" + str(nproc) + " (at most " +
                      str(hard) + " here)");
  }
  if (static_cast<std::int64_t>(nproc) * c.max_nodes > kMaxWorldSize) {
    throw ConfigError("--nnodes=" + str(c.max_nodes) + " x --nproc-per-node=" + str(nproc) +
                      " is more than " + str(kMaxWorldSize) + " workers in all");
  }
}

void check_counts(const LaunchConfig& c) {
  if (c.max_nodes > kMaxNodes) {
    throw ConfigError("--nnodes: " + str(c.max_nodes) + " nodes is more than " + str(kMaxNodes));
  }
  if (c.node_rank >= kMaxNodes) {
    throw ConfigError("--node-rank: " + str(c.node_rank) + " is not below " + str(kMaxNodes));
  }
  if (c.max_restarts > kMaxRestarts) {
    throw ConfigError("--max-restarts: " + str(c.max_restarts) + " is more than " +
                      str(kMaxRestarts));
  }
  if (!(c.monitor_interval_s <= kMaxSeconds)) {
    throw ConfigError("--monitor-interval: must be at most " + str(static_cast<int>(kMaxSeconds)) +
                      " seconds");
  }
  if (c.max_nproc_per_node &&
      (*c.max_nproc_per_node <= 0 || *c.max_nproc_per_node > kNprocCeiling)) {
    throw ConfigError("--max-nproc-per-node: " + str(*c.max_nproc_per_node) + " is not in [1, " +
                      str(kNprocCeiling) + "]");
  }
  if (c.nproc_per_node != "cpu" && c.nproc_per_node != "gpu" && c.nproc_per_node != "auto") {
    const int n = std::stoi(c.nproc_per_node);  // validated as a positive integer already
    const int flag_bound = c.max_nproc_per_node.value_or(kNprocCeiling);
    if (n > flag_bound) {
      throw ConfigError("--nproc-per-node=" + c.nproc_per_node + " is above " +
                        (c.max_nproc_per_node ? "--max-nproc-per-node=" + str(flag_bound)
                                              : "the most workers per node ever accepted (" +
                                                    str(kNprocCeiling) + ")"));
    }
  }
  for (int r : c.local_ranks_filter) check_local_rank(r, "--local-ranks-filter");
  for (const auto& [r, s] : c.redirects.per_rank) check_local_rank(r, "--redirects");
  for (const auto& [r, s] : c.tee.per_rank) check_local_rank(r, "--tee");
  for (const char* key :
       {"join_timeout", "last_call_timeout", "read_timeout", "close_timeout", "timeout"}) {
    check_seconds(c, key, false);
  }
  check_seconds(c, "keep_alive_interval", true);
  if (c.etcd()) check_etcd_conf(c);
  if (auto it = c.rdzv_conf.find("keep_alive_max_attempt"); it != c.rdzv_conf.end()) {
    (void)parse_int(it->second, "--rdzv-conf keep_alive_max_attempt", 1, kMaxKeepAliveAttempts);
  }

  if (c.rdzv_backend == "static" && !c.private_store && c.endpoint().port == 0) {
    throw ConfigError(
        (c.rdzv_endpoint.empty() ? std::string("--master-port=0")
                                 : "--rdzv-endpoint=" + c.rdzv_endpoint) +
        ": the static backend needs a fixed port that every node knows in advance (port 0 "
        "would be a random one that no other node can find); give a port, or use "
        "--standalone (one node) or --rdzv-backend=c10d");
  }
}

}  // namespace ddp::launch
