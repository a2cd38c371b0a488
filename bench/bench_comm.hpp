// What the communicator benches share (allreduce_bench.cpp, collectives_bench.cpp): sizes with
// K/M suffixes, the worker's communicator as ddp-train builds it (gloo, shared memory when every
// rank is on one host), nccl-tests' timing policy on the slowest rank, and the JSON output.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/env.hpp"

extern char** environ;

namespace ddp::bench {

using Clock = std::chrono::steady_clock;

// Bytes with an optional K or M suffix (KiB, MiB); a positive multiple of 4.
inline std::size_t parse_size(const std::string& text) {
  std::size_t mult = 1;
  std::string digits = text;
  if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'k')) mult = 1024;
  if (!digits.empty() && (digits.back() == 'M' || digits.back() == 'm')) mult = 1024 * 1024;
  if (mult > 1) digits.pop_back();
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (digits.empty() || used != digits.size() || n == 0 || (n * mult) % 4 != 0) {
    throw ConfigError("--sizes: '" + text + "' is not a positive multiple of 4 bytes");
  }
  return static_cast<std::size_t>(n) * mult;
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The largest of every rank's `seconds` (all_gather: the communicator has no MAX reduction).
inline double slowest(worker::Communicator& comm, double seconds) {
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&seconds, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

// The worker's environment, store and communicator, as ddp-train makes them.
struct BenchComm {
  worker::WorkerEnv env;
  std::unique_ptr<worker::WorkerStore> store;
  std::unique_ptr<worker::Communicator> comm;
};

inline BenchComm open_comm(bool shm) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  BenchComm b;
  b.env = worker::read_worker_env(vars);
  b.store = std::make_unique<worker::WorkerStore>(b.env);
  worker::CommOptions options;
  options.rank = b.env.rank;
  options.size = b.env.world_size;
  options.store = b.store->client();
  options.key_prefix = b.env.store_prefix() + "/gloo";
  options.route_towards = b.env.master_addr;
  b.comm = worker::make_gloo_communicator(options);
  if (shm && b.env.local_world_size == b.env.world_size) {
    b.comm = worker::make_local_communicator(std::move(b.comm), options);
  }
  return b;
}

// nccl-tests' policy: a barrier, `warmup` untimed calls, a calibration (k = 1, 2, 4, ... calls
// until k take >= target_s / 10 on the slowest rank), then clamp(target * k / that time,
// min_iters, max_iters) timed calls after a barrier. Returns (iters, the slowest rank's
// seconds per call).
inline std::pair<long, double> time_calls(worker::Communicator& comm,
                                          const std::function<void()>& call, int warmup,
                                          double target_s, long min_iters, long max_iters) {
  comm.barrier();
  for (int i = 0; i < warmup; ++i) call();
  long k = 1;
  double took = 0;
  for (;;) {
    const auto t0 = Clock::now();
    for (long i = 0; i < k; ++i) call();
    took = slowest(comm, seconds_since(t0));
    if (took >= target_s / 10 || k >= max_iters) break;
    k *= 2;
  }
  const auto want = std::ceil(target_s * static_cast<double>(k) / std::max(took, 1e-9));
  const long iters = std::clamp(static_cast<long>(std::min(want, 1e9)), min_iters, max_iters);
  comm.barrier();
  const auto t0 = Clock::now();
  for (long i = 0; i < iters; ++i) call();
  return {iters, slowest(comm, seconds_since(t0)) / static_cast<double>(iters)};
}

// main() of a bench: 2 for bad arguments, 1 for a failure, each said on stderr with `name`.
template <typename Parse, typename Run>
int bench_main(const char* name, Parse parse, Run run) {
  decltype(parse()) args;
  try {
    args = parse();
  } catch (const ConfigError& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 2;
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 1;
  }
}

inline void write_json(const nlohmann::json& results, const std::string& path) {
  std::ofstream f(path);
  f << results.dump(2) << "\n";
  if (!f) throw IoError("cannot write " + path);
}

}  // namespace ddp::bench
