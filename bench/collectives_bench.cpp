// ddp_collectives_bench: our communicator's reduce_scatter_sum and all_gather_v on float32, one
// process per rank under ddprun (or torchrun), shared memory between the ranks of one host
// unless --no-shm; the policy and JSON of bench/collectives_bench.py's torch side. Per op and
// size (the whole's bytes, even parts): a barrier, --warmup untimed calls, a calibration (k = 1,
// 2, 4, ... calls until k take >= --target-s / 10 on the slowest rank), then iters =
// clamp(target * k / that time, 3, 100000) timed calls after a barrier; time per op is the
// slowest rank's time / iters; algbw = bytes / time, busbw = algbw * (n-1)/n (nccl-tests).
// --check first verifies one call of each per size. Rank 0 writes --out.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/env.hpp"
#include "bench_comm.hpp"

namespace {

using ddp::bench::parse_size;
constexpr long kMinIters = 3;
constexpr long kMaxIters = 100000;

struct Args {
  std::vector<std::size_t> sizes;
  std::vector<std::string> ops{"reduce_scatter", "all_gather"};
  int warmup = 2;
  double target_s = 0.3;
  bool check = false;
  bool shm = true;
  std::string out;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::string sizes = "1M,16M,64M";
  for (int i = 1; i < argc; ++i) {
    std::string opt = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ddp::ConfigError(opt + " needs a value");
      return argv[++i];
    };
    try {
      if (opt == "--sizes") {
        sizes = value();
      } else if (opt == "--ops") {
        a.ops = split(value());
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
        throw ddp::ConfigError("unknown option '" + opt +
                               "' (--sizes LIST --ops reduce_scatter,all_gather --warmup N "
                               "--target-s S --check --no-shm --out PATH)");
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
  for (const auto& op : a.ops) {
    if (op != "reduce_scatter" && op != "all_gather") {
      throw ddp::ConfigError("--ops: '" + op + "' is not reduce_scatter or all_gather");
    }
  }
  for (const auto& item : split(sizes)) a.sizes.push_back(parse_size(item));
  return a;
}

// One call of `op` checked: rank q's whole is q + 1 everywhere (reduce-scatter: every element
// of the part is n(n+1)/2), or its part is q + 1 (all-gather: part q of the whole is q + 1).
bool check_once(ddp::worker::Communicator& comm, const std::string& op,
                const std::vector<std::size_t>& counts) {
  const auto r = static_cast<std::size_t>(comm.rank());
  const int n = comm.size();
  const auto off = ddp::worker::shard_offsets("check", counts, n);
  if (op == "reduce_scatter") {
    std::vector<float> in(off.back(), static_cast<float>(r + 1));
    std::vector<float> out(counts[r]);
    comm.reduce_scatter_sum(in.data(), out.data(), counts);
    const auto want = static_cast<float>(n * (n + 1) / 2);
    return std::all_of(out.begin(), out.end(), [&](float v) { return v == want; });
  }
  std::vector<float> part(counts[r], static_cast<float>(r + 1));
  std::vector<float> whole(off.back());
  comm.all_gather_v(part.data(), whole.data(), counts);
  for (std::size_t q = 0; q < counts.size(); ++q) {
    for (std::size_t j = 0; j < counts[q]; ++j) {
      if (whole[off[q] + j] != static_cast<float>(q + 1)) return false;
    }
  }
  return true;
}

int run(const Args& args) {
  ddp::bench::BenchComm b = ddp::bench::open_comm(args.shm);
  const auto& env = b.env;
  auto& comm = b.comm;
  const int n = comm->size();
  const auto r = static_cast<std::size_t>(env.rank);

  nlohmann::json results = nlohmann::json::array();
  for (const auto& op : args.ops) {
    for (std::size_t bytes : args.sizes) {
      const std::size_t total = bytes / sizeof(float);
      const auto counts = ddp::worker::even_shards(total, n);
      if (args.check && !check_once(*comm, op, counts)) {
        std::cerr << "ddp_collectives_bench: rank " << env.rank << ": " << op << " of " << bytes
                  << " bytes gave wrong values\n";
        return 1;
      }
      std::vector<float> whole(total, 1.0f);
      std::vector<float> part(counts[r], 1.0f);
      const std::function<void()> call =
          op == "reduce_scatter" ? std::function<void()>([&] {
            comm->reduce_scatter_sum(whole.data(), part.data(), counts);
          })
                                 : std::function<void()>([&] {
                                     comm->all_gather_v(part.data(), whole.data(), counts);
                                   });
      const auto [iters, per_op] =
          ddp::bench::time_calls(*comm, call, args.warmup, args.target_s, kMinIters, kMaxIters);
      const double algbw = static_cast<double>(bytes) / per_op / 1e9;
      results.push_back({{"op", op},
                         {"bytes", bytes},
                         {"iters", iters},
                         {"time_us", per_op * 1e6},
                         {"algbw_gbps", algbw},
                         {"busbw_gbps", algbw * (n - 1) / n},
                         {"world_size", n},
                         {"impl", std::string("ddprun ") + comm->backend()}});
      if (env.rank == 0) {
        std::fprintf(stderr, "%-14s %10zu B  %6ld iters  %10.1f us  algbw %7.3f GB/s\n", op.c_str(),
                     bytes, iters, per_op * 1e6, algbw);
      }
    }
  }
  if (env.rank == 0 && !args.out.empty()) ddp::bench::write_json(results, args.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::bench::bench_main(
      "ddp_collectives_bench", [&] { return parse_args(argc, argv); }, run);
}
