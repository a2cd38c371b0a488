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
#include "bench_comm.hpp"

namespace {

using ddp::bench::parse_size;
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

int run(const Args& args) {
  ddp::bench::BenchComm b = ddp::bench::open_comm(args.shm);
  const auto& env = b.env;
  auto& comm = b.comm;
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
    const auto [iters, per_op] = ddp::bench::time_calls(
        *comm, [&] { comm->all_reduce_sum(buf.data(), count); }, args.warmup, args.target_s,
        kMinIters, kMaxIters);
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
  if (env.rank == 0 && !args.out.empty()) ddp::bench::write_json(results, args.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::bench::bench_main(
      "ddp_allreduce_bench", [&] { return parse_args(argc, argv); }, run);
}
