// auth_load: load from ddprun's own store client, which is the one that authenticates, for
// bench/store_auth_bench.py (issue 22: what a secret costs).
//   storm:      N clients connect at once (T threads, N/T each, connected one after the other
//               and all kept open), each does init_process_group's ADD, then a WAIT for the key
//               the last one sets -> the wall seconds.
//   throughput: C connections, each with its own thread, GET/SET alternating for S seconds,
//               connections opened inside the timed window -> ops/s.
// With DDPRUN_STORE_SECRET set (or _FILE), every client authenticates; unset, none does. The
// bytes are otherwise the same. One JSON line on stdout.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/proto/auth.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/store_tls.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

ddp::rdzv::ClientOptions options() {
  ddp::rdzv::ClientOptions o;
  o.timeout = std::chrono::seconds(60);
  o.connect_timeout = std::chrono::seconds(60);
  if (auto s = ddp::proto::auth::job_secret()) o.secret = std::move(*s);
  static const auto tls = ddp::rdzv::store_client_tls();  // one context: sessions resume
  o.tls = tls;
  return o;
}

double storm(const std::string& host, std::uint16_t port, int clients, int threads) {
  const auto o = options();
  const std::string count = "/storm/count", done = "/storm/done";
  std::atomic<int> errors{0};
  auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<std::unique_ptr<ddp::rdzv::StoreClient>> mine;
      try {
        for (int i = t; i < clients; i += threads) {
          mine.push_back(std::make_unique<ddp::rdzv::StoreClient>(host, port, o));
          if (mine.back()->add(count, 1) == clients) mine.back()->set(done, "1");
        }
        for (auto& c : mine) c->wait({done});
      } catch (const std::exception& e) {
        if (errors.fetch_add(1) == 0) std::fprintf(stderr, "auth_load: %s\n", e.what());
      }
    });
  }
  for (auto& th : pool) th.join();
  if (errors.load() > 0) return -1;
  return since(t0);
}

double throughput(const std::string& host, std::uint16_t port, int conns, double seconds) {
  const auto o = options();
  std::atomic<long> ops{0};
  std::atomic<int> errors{0};
  auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int c = 0; c < conns; ++c) {
    pool.emplace_back([&, c] {
      try {
        ddp::rdzv::StoreClient client(host, port, o);
        const std::string key = "/tp/" + std::to_string(c);
        long n = 0;
        client.set(key, "x");
        while (Clock::now() < end) {
          client.set(key, "value-of-some-bytes");
          client.get(key);
          n += 2;
        }
        ops.fetch_add(n);
      } catch (const std::exception& e) {
        if (errors.fetch_add(1) == 0) std::fprintf(stderr, "auth_load: %s\n", e.what());
      }
    });
  }
  for (auto& th : pool) th.join();
  if (errors.load() > 0) return -1;
  return static_cast<double>(ops.load()) / since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", mode = "storm";
  std::uint16_t port = 0;
  int clients = 4096, threads = 128, conns = 64;
  double seconds = 3;
  CLI::App app{"auth_load: ddprun client load with or without the store secret"};
  app.add_option("--host", host);
  app.add_option("--port", port)->required();
  app.add_option("--mode", mode)->check(CLI::IsMember({"storm", "throughput"}));
  app.add_option("--clients", clients)->check(CLI::Range(1, 65536));
  app.add_option("--threads", threads)->check(CLI::Range(1, 1024));
  app.add_option("--conns", conns)->check(CLI::Range(1, 4096));
  app.add_option("--seconds", seconds)->check(CLI::Range(0.1, 600.0));
  CLI11_PARSE(app, argc, argv);
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  const bool secret = ddp::proto::auth::job_secret().has_value();
  if (mode == "storm") {
    const double s = storm(host, port, clients, threads);
    std::printf("{\"mode\":\"storm\",\"clients\":%d,\"secret\":%s,\"seconds\":%.4f}\n", clients,
                secret ? "true" : "false", s);
    return s < 0 ? 1 : 0;
  }
  const double r_ops = throughput(host, port, conns, seconds);
  std::printf("{\"mode\":\"throughput\",\"conns\":%d,\"secret\":%s,\"ops_per_s\":%.1f}\n", conns,
              secret ? "true" : "false", r_ops);
  return r_ops < 0 ? 1 : 0;
}
