// Sanity bounds on every count and duration ddprun is given (issue 14): node counts, ranks,
// restarts, per-rank maps, rdzv-conf numbers, and the workers per node, whose default bound
// follows the machine (RLIMIT_NPROC, pid_max) and can be raised by --max-nproc-per-node up to
// a hard bound, also the machine's. Pure functions: the machine is passed in, so every bound
// is unit-tested without processes; read_machine_limits() is the only call that looks.
#pragma once

#include <cstdint>
#include <optional>

#include "ddp/launch/config.hpp"

namespace ddp::launch {

inline constexpr int kMaxNodes = 65536;          // --nnodes, and --node-rank below it
inline constexpr int kMaxRestarts = 100000;      // --max-restarts
inline constexpr int kMaxLocalRank = 65535;      // a local rank named in a flag (filter, maps)
inline constexpr int kNprocCeiling = 65536;      // --max-nproc-per-node, whatever the machine
inline constexpr int kDefaultNprocBound = 1024;  // workers per node without the flag (at most)
inline constexpr double kMaxSeconds = 604800;    // one week: timeouts and intervals
inline constexpr double kMaxOutageGraceSeconds = 86400;  // a day: --store-outage-grace
inline constexpr int kMaxKeepAliveAttempts = 1000;
inline constexpr std::int64_t kMaxWorldSize = std::int64_t{1} << 24;  // nodes x workers

struct MachineLimits {
  std::int64_t rlimit_nproc = -1;  // RLIMIT_NPROC's soft limit; -1: unlimited
  std::int64_t pid_max = 4194304;  // /proc/sys/kernel/pid_max
};

// This machine's limits, for the calls below.
MachineLimits read_machine_limits();

// Workers per node accepted without --max-nproc-per-node: min(1024, RLIMIT_NPROC/2,
// pid_max/16), at least 1.
int default_nproc_bound(const MachineLimits& m);
// The most --max-nproc-per-node may allow: min(65536, RLIMIT_NPROC, pid_max/2), at least 1.
int hard_nproc_bound(const MachineLimits& m);

// The resolved worker count against the bound in force (the flag's, else the default) and the
// world size (nnodes x nproc); throws ddp::ConfigError naming the flag and the bound.
void check_nproc(int nproc, const LaunchConfig& c, const MachineLimits& m);

// Every count and number of the parsed command line that needs no machine: --nnodes,
// --node-rank, --max-restarts, --monitor-interval, --local-ranks-filter, the per-rank maps of
// --redirects/--tee, --rdzv-conf's timeouts and keep_alive_max_attempt, --max-nproc-per-node,
// and --master-port=0 with the static backend. Throws ddp::ConfigError naming the flag.
void check_counts(const LaunchConfig& c);

}  // namespace ddp::launch
