// rdzv_bench: ddprun's rendezvous at scale, on this machine. N simulated agents (threads, one
// store connection each, connected before the clock starts) form one round of exactly N nodes
// against a store server (in this process, or --endpoint for a ddprund); reports the round
// time (start signal -> last agent has its assignment) and store requests per agent (from the
// in-process server's counter). Then the dead-node detection latency of the liveness lease
// will: (a) an agent's connection closes (SIGKILL), (b) an agent goes silent (SIGSTOP; the
// lease expires on the server's clock): time until a watcher's WAIT on the round's event key
// returns, minus the lease TTL for (b). One JSON line per measurement.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/launch/rendezvous.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/fd_limit.hpp"
#include "ddp/rdzv/server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace launch = ddp::launch;
namespace rdzv = ddp::rdzv;

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

struct Gate {  // all agents connected -> start together
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  bool go = false;
};

rdzv::ClientOptions client_options() {
  rdzv::ClientOptions o;
  o.timeout = 120s;
  o.connect_timeout = 60s;
  return o;
}

// One round of n agents; returns {round ms, requests per agent (or -1)}.
std::pair<double, double> one_round(const std::string& host, std::uint16_t port, int n,
                                    const std::string& run_id, rdzv::StoreServer* server) {
  Gate gate;
  std::vector<Clock::time_point> done(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        rdzv::StoreClient client(host, port, client_options());
        launch::RendezvousOptions o;
        o.run_id = run_id;
        o.min_nodes = o.max_nodes = n;
        o.join_timeout = 300s;
        launch::Rendezvous r(client, o);
        launch::NodeDesc self;
        self.host = "node" + std::to_string(i);
        self.addr = self.host;
        self.pid = 100000 + i;
        self.nproc = 8;
        {
          std::unique_lock<std::mutex> lk(gate.mu);
          ++gate.ready;
          gate.cv.notify_all();
          gate.cv.wait(lk, [&] { return gate.go; });
        }
        r.next_round(self);
        done[static_cast<std::size_t>(i)] = Clock::now();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
        done[static_cast<std::size_t>(i)] = Clock::now();
      }
    });
  }
  {
    std::unique_lock<std::mutex> lk(gate.mu);
    gate.cv.wait(lk, [&] { return gate.ready == n; });
  }
  const auto requests_before = server ? server->stats().requests : 0;
  const auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> g(gate.mu);
    gate.go = true;
  }
  gate.cv.notify_all();
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.empty()) throw std::runtime_error("an agent failed: " + e);
  }
  const auto t1 = *std::max_element(done.begin(), done.end());
  double per_agent = -1;
  if (server) per_agent = static_cast<double>(server->stats().requests - requests_before) / n;
  return {ms_since(t0, t1), per_agent};
}

// Detection latency: a lease with a will on `key`; `silent` lets it expire (TTL), otherwise
// the holder's connection closes. Returns ms from the trigger (close, or the TTL's end) to the
// watcher's WAIT returning.
double detection(const std::string& host, std::uint16_t port, bool silent,
                 std::chrono::milliseconds ttl, const std::string& key) {
  rdzv::StoreClient watcher(host, port, client_options());
  auto holder = std::make_unique<rdzv::StoreClient>(host, port, client_options());
  auto lease = holder->lease_grant(silent ? ttl : 0ms, /*bind_to_connection=*/!silent);
  holder->lease_will(lease, key, "lost");
  // The lease's clock starts at the grant: the TTL ends at most this long after it.
  const auto trigger = silent ? Clock::now() + ttl : Clock::now();
  if (!silent) holder.reset();  // the agent "dies": its connection closes
  std::thread w([&] { watcher.wait({key}, 60s); });
  w.join();
  return ms_since(trigger, Clock::now());
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rdzv_bench: ddprun rendezvous round time and dead-node detection"};
  std::string agents = "2,8,64,256,1024,4096";
  std::string endpoint;
  int reps = 3;
  int detect_reps = 5;
  int lease_ms = 1000;
  unsigned server_threads = 0;
  app.add_option("--agents", agents, "comma list of agent counts")->capture_default_str();
  app.add_option("--reps", reps, "rounds per agent count")->capture_default_str();
  app.add_option("--endpoint", endpoint, "host:port of a ddprund (default: in-process server)");
  app.add_option("--server-threads", server_threads, "in-process server loops (0: ddprund's)");
  app.add_option("--detect-reps", detect_reps, "detection measurements of each kind")
      ->capture_default_str();
  app.add_option("--lease-ms", lease_ms, "lease TTL for the silent-agent case")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  rdzv::raise_fd_limit();
  std::unique_ptr<rdzv::StoreServer> server;
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  if (endpoint.empty()) {
    rdzv::ServerOptions so;
    so.threads = server_threads;
    server = std::make_unique<rdzv::StoreServer>(so);
    server->start();
    port = server->port();
  } else {
    auto colon = endpoint.rfind(':');
    host = endpoint.substr(0, colon);
    port = static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1)));
  }

  int run = 0;
  for (int n : parse_list(agents)) {
    for (int rep = 0; rep < reps; ++rep) {
      auto [ms, per_agent] =
          one_round(host, port, n, "bench-" + std::to_string(run++), server.get());
      std::printf(
          "{\"measure\":\"round\",\"agents\":%d,\"rep\":%d,\"round_ms\":%.2f,"
          "\"requests_per_agent\":%.2f}\n",
          n, rep, ms, per_agent);
      std::fflush(stdout);
    }
  }
  for (bool silent : {false, true}) {
    for (int rep = 0; rep < detect_reps; ++rep) {
      double ms = detection(host, port, silent, std::chrono::milliseconds(lease_ms),
                            "/bench/detect/" + std::to_string(run++));
      std::printf(
          "{\"measure\":\"detection\",\"cause\":\"%s\",\"lease_ms\":%d,\"rep\":%d,"
          "\"after_trigger_ms\":%.2f}\n",
          silent ? "silent (lease expiry)" : "connection closed", silent ? lease_ms : 0, rep, ms);
      std::fflush(stdout);
    }
  }
  return 0;
}
