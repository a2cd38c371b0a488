// ddp_allreduce_bench: our gloo communicator's all_reduce_sum on float32, one process per rank
// started by ddprun (or torchrun); the policy and JSON of bench/torch_allreduce_bench.py.
// Per size: a barrier, --warmup untimed all-reduces, a calibration (k = 1, 2, 4, ... all-reduces
// until k take >= --target-s / 10 on the slowest rank), then iters = clamp(target * k / that
// time, 5, 100000) timed all-reduces after a barrier; time per op is the slowest rank's time /
// iters; algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests). Rank 0 writes --out.
// --check first verifies one all-reduce per size (rank r sends r+1, expects n(n+1)/2).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/env.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
constexpr long kMinIters = 5;
constexpr long kMaxIters = 100000;

struct Args {
  std::vector<std::size_t> sizes;
  int warmup = 5;
  double target_s = 0.5;
  bool check = false;
  bool shm = true;
  std::string out;
};

// Bytes with an optional K or M suffix (KiB, MiB); a positive multiple of 4.
std::size_t parse_size(const std::string& text) {
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
  if (digits.empty() || used != digits.size() || n == 0 || (n * mult) % 4 != 0)
    throw ddp::ConfigError("--sizes: '" + text + "' is not a positive multiple of 4 bytes");
  return static_cast<std::size_t>(n) * mult;
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::string sizes = "4K,16K,64K,256K,1M,4M,16M,64M";
  for (int i = 1; i < argc; ++i) {
    std::string opt = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ddp::ConfigError(opt + " needs a value");
      return argv[++i];
    };
    try {
      if (opt == "--sizes") {
        sizes = value();
      } else if (opt == "--warmup") {
        a.warmup = std::stoi(value());
      } else if (opt == "--target-s") {
        a.target_s = std::stod(value());
      } else if (opt == "--out") {
        a.out = value();
      } else if (opt == "--check") {
        a.check = true;
      } else if (opt == "--no-shm") {
        a.shm = false;
      } else {
        throw ddp::ConfigError(
            "unknown option '" + opt +
            "' (--sizes LIST --warmup N --target-s S --check --no-shm --out PATH)");
      }
    } catch (const std::invalid_argument&) {
      throw ddp::ConfigError(opt + ": not a number");
    } catch (const std::out_of_range&) {
      throw ddp::ConfigError(opt + ": out of range");
    }
  }
  if (a.warmup < 0 || !(a.target_s > 0)) {
    throw ddp::ConfigError("--warmup must be >= 0 and --target-s > 0");
  }
  std::stringstream ss(sizes);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) a.sizes.push_back(parse_size(item));
  }
  return a;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The largest of every rank's `seconds` (all_gather: the communicator has no MAX reduction).
double slowest(ddp::worker::Communicator& comm, double seconds) {
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&seconds, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

int run(const Args& args) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const auto env = ddp::worker::read_worker_env(vars);
  ddp::worker::WorkerStore store(env);
  ddp::worker::CommOptions options;
  options.rank = env.rank;
  options.size = env.world_size;
  options.store = store.client();
  options.key_prefix = env.store_prefix() + "/gloo";
  options.route_towards = env.master_addr;
  auto comm = ddp::worker::make_gloo_communicator(options);
  // As ddp-train does: ranks that share one host all-reduce through shared memory.
  if (args.shm && env.local_world_size == env.world_size) {
    comm = ddp::worker::make_local_communicator(std::move(comm), options);
  }
  const int n = comm->size();

  nlohmann::json results = nlohmann::json::array();
  for (std::size_t bytes : args.sizes) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> buf(count, 1.0f);
    if (args.check) {
      std::fill(buf.begin(), buf.end(), static_cast<float>(env.rank + 1));
      comm->all_reduce_sum(buf.data(), count);
      const auto expect = static_cast<float>(n * (n + 1) / 2);
      const auto bad = std::count_if(buf.begin(), buf.end(), [&](float v) { return v != expect; });
      if (bad != 0) {
        std::cerr << "ddp_allreduce_bench: rank " << env.rank << ": " << bad << " of " << count
                  << " elements != " << expect << " at " << bytes << " bytes\n";
        return 1;
      }
    }
    comm->barrier();
    for (int i = 0; i < args.warmup; ++i) comm->all_reduce_sum(buf.data(), count);
    long k = 1;
    double took = 0;
    for (;;) {
      const auto t0 = Clock::now();
      for (long i = 0; i < k; ++i) comm->all_reduce_sum(buf.data(), count);
      took = slowest(*comm, seconds_since(t0));
      if (took >= args.target_s / 10 || k >= kMaxIters) break;
      k *= 2;
    }
    const auto want = std::ceil(args.target_s * static_cast<double>(k) / std::max(took, 1e-9));
    const long iters = std::clamp(static_cast<long>(std::min(want, 1e9)), kMinIters, kMaxIters);
    comm->barrier();
    const auto t0 = Clock::now();
    for (long i = 0; i < iters; ++i) comm->all_reduce_sum(buf.data(), count);
    const double per_op = slowest(*comm, seconds_since(t0)) / static_cast<double>(iters);
    const double algbw = static_cast<double>(bytes) / per_op / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    results.push_back({{"bytes", bytes},
                       {"count", count},
                       {"iters", iters},
                       {"time_us", per_op * 1e6},
                       {"algbw_gbps", algbw},
                       {"busbw_gbps", busbw},
                       {"world_size", n},
                       {"impl", std::string("ddprun ") + comm->backend()}});
    if (env.rank == 0) {
      std::fprintf(stderr, "%10zu B  %6ld iters  %10.1f us  algbw %7.3f GB/s  busbw %7.3f GB/s\n",
                   bytes, iters, per_op * 1e6, algbw, busbw);
    }
  }
  if (env.rank == 0 && !args.out.empty()) {
    std::ofstream f(args.out);
    f << results.dump(2) << "\n";
    if (!f) throw ddp::IoError("cannot write " + args.out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const ddp::ConfigError& e) {
    std::cerr << "ddp_allreduce_bench: " << e.what() << "\n";
    return 2;
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "ddp_allreduce_bench: " << e.what() << "\n";
    return 1;
  }
}
