// loadgen_modes: store_loadgen's two modes, each printing one JSON line: mix (closed-loop
// SET/GET/ADD/WAIT traffic) and storm (N clients at once through an ADD + WAIT barrier).
#pragma once

#include <cstdint>
#include <string>

#include "loadgen_wire.hpp"

namespace loadgen {

struct MixConfig {
  Endpoint ep;
  int connections = 1;
  int threads = 1;
  double duration_s = 5;
  double warmup_s = 1;
  std::string mix = "set=40,get=40,add=15,wait=5";
  std::uint64_t keys = 1024;
  std::size_t value_bytes = 64;
  std::uint64_t seed = 1;
  int server_pid = 0;  // when set, the server's CPU time over the window is reported too
};

// Closed-loop traffic from cfg.connections connections on cfg.threads epoll threads -> one JSON
// line with throughput and latency. Returns the exit status.
int run_mix(const MixConfig& cfg);

// `clients` clients connect at once and do init_process_group's ADD + WAIT barrier -> one JSON
// line with the wall time. Returns the exit status.
int run_storm(const Endpoint& ep, int clients, int threads, double timeout_s);

}  // namespace loadgen
