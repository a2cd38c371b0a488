// etcd_rdzv_bench: ddprun's rendezvous round on etcd v3 against the same round on a c10d store
// (a ddprund), with agents as processes (fork, one store connection each, connected before the
// clock starts), as bench/etcd_rdzv_bench.py drives it beside torchrun's etcd-v2 rendezvous.
//   round:  N agents form one round of exactly N nodes; time from the start signal to the last
//           agent holding its assignment; etcd requests per agent (the client's own count).
//   reform: N agents with their liveness (etcd: EtcdLiveness's lease and will; c10d: the
//           store's connection-bound lease) form a round of N-1..N nodes; one is SIGKILLed;
//           time until the N-1 survivors hold the next round (etcd: includes the lease TTL).
// One JSON line per measurement.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/launch/agent_etcd.hpp"
#include "ddp/launch/liveness.hpp"
#include "ddp/launch/resilient_store.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/round.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/fd_limit.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace launch = ddp::launch;
namespace rdzv = ddp::rdzv;

struct Result {  // one agent's report, written whole to a pipe (atomic below PIPE_BUF)
  std::int32_t index = 0;
  std::int32_t phase = 0;  // 1: first round formed, 2: re-formed
  std::int32_t ok = 0;
  std::int64_t t_ns = 0;  // steady clock
  std::int64_t requests = 0;
  char error[200] = {};
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Setup {
  std::string backend;  // etcd | c10d
  std::vector<rdzv::Endpoint> endpoints;
  std::chrono::milliseconds lease{2000};
  rdzv::TlsOptions tls;  // https:// members
};

void send(int fd, const Result& r) { [[maybe_unused]] auto n = ::write(fd, &r, sizeof r); }

// One agent process: connect, say ready, wait for go, form; with `reform`, keep a lease, wait
// for the round's event and form the next round without the killed agent.
[[noreturn]] void agent(const Setup& s, int index, int n, bool reform, const std::string& run,
                        int ready_w, int go_r, int result_w) {
  Result r;
  r.index = index;
  try {
    std::unique_ptr<rdzv::Store> store;
    std::unique_ptr<launch::AgentLiveness> liveness;
    rdzv::etcd::EtcdStore* etcd = nullptr;
    launch::EtcdSettings es;
    es.options.endpoints = s.endpoints;
    es.options.timeout = 120s;
    es.options.tls = s.tls;
    launch::RendezvousOptions o;
    o.run_id = run;
    o.min_nodes = reform ? n - 1 : n;
    o.max_nodes = n;
    o.join_timeout = 300s;
    o.last_call = 1s;
    if (s.backend == "etcd") {
      auto e = std::make_unique<rdzv::etcd::EtcdStore>(es.options, "", 120s);
      etcd = e.get();
      store = std::move(e);
      if (reform)
        liveness = std::make_unique<launch::EtcdLiveness>(es, "/ddprun/" + run, s.lease / 4, 4);
    } else {
      rdzv::ClientOptions co;
      co.timeout = 120s;
      co.connect_timeout = 60s;
      const auto& ep = s.endpoints.front();
      store = std::make_unique<rdzv::StoreClient>(ep.host, ep.port, co);
      if (reform)
        liveness = std::make_unique<launch::Liveness>(launch::dialer(ep.host, ep.port, co),
                                                      s.lease / 4, 4);
    }
    launch::Rendezvous rv(*store, o);
    launch::NodeDesc self;
    self.host = "node" + std::to_string(index);
    self.addr = self.host;
    self.pid = static_cast<int>(::getpid());
    self.nproc = 8;
    if (etcd) etcd->check({"/warm"});  // connected before the clock starts
    char byte = 1;
    [[maybe_unused]] auto w = ::write(ready_w, &byte, 1);
    if (::read(go_r, &byte, 1) != 1) ::_exit(3);
    const std::uint64_t before = etcd ? etcd->http().requests() : 0;
    launch::RoundEvent lost;
    lost.kind = launch::RoundEvent::Kind::lost;
    lost.host = self.host;
    lost.pid = self.pid;
    auto on_join = [&](int round) {
      if (liveness) liveness->set_will(rv.event_key(round), launch::encode(lost));
    };
    launch::Round round = rv.next_round(self, -1, reform ? n : 0, on_join);
    r.phase = 1;
    r.ok = 1;
    r.t_ns = now_ns();
    r.requests = etcd ? static_cast<std::int64_t>(etcd->http().requests() - before) : -1;
    send(result_w, r);
    if (reform) {
      store->wait({rv.event_key(round)}, 120s);
      round = rv.next_round(self, round.number + 1, n - 1, on_join);
      r.phase = 2;
      r.t_ns = now_ns();
      send(result_w, r);
    }
    ::_exit(0);  // leases expire on their own; nothing to clean up in a bench
  } catch (const std::exception& e) {
    r.ok = 0;
    r.phase = 1;
    std::snprintf(r.error, sizeof r.error, "%s", e.what());
    send(result_w, r);
    ::_exit(1);
  }
}

void read_all(int fd, void* buf, std::size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k <= 0) throw std::runtime_error("agent pipe closed early");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void measure(const Setup& s, int n, bool reform, const std::string& run, int rep) {
  int ready[2], go[2], res[2];
  if (::pipe(ready) || ::pipe(go) || ::pipe(res)) throw std::runtime_error("pipe failed");
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      ::close(res[0]);
      agent(s, i, n, reform, run, ready[1], go[0], res[1]);
    }
    pids.push_back(pid);
  }
  ::close(ready[1]);
  ::close(go[0]);
  ::close(res[1]);
  std::vector<char> bytes(static_cast<std::size_t>(n));
  read_all(ready[0], bytes.data(), bytes.size());
  const std::int64_t t_go = now_ns();
  [[maybe_unused]] auto w = ::write(go[1], bytes.data(), bytes.size());
  std::int64_t last = 0;
  double requests = 0;
  std::string error;
  for (int i = 0; i < n; ++i) {
    Result r;
    read_all(res[0], &r, sizeof r);
    if (!r.ok) error = r.error;
    last = std::max(last, r.t_ns);
    requests += static_cast<double>(r.requests);
  }
  if (!error.empty()) throw std::runtime_error("an agent failed: " + error);
  std::printf(
      "{\"measure\":\"round\",\"backend\":\"%s\",\"agents\":%d,\"rep\":%d,\"round_ms\":%.2f,"
      "\"requests_per_agent\":%.2f}\n",
      s.backend.c_str(), n, rep, static_cast<double>(last - t_go) / 1e6, requests / n);
  std::fflush(stdout);
  if (reform) {
    const std::int64_t t_kill = now_ns();
    ::kill(pids.front(), SIGKILL);
    std::int64_t reformed = 0;
    for (int i = 0; i < n - 1; ++i) {
      Result r;
      read_all(res[0], &r, sizeof r);
      if (!r.ok) throw std::runtime_error(std::string("an agent failed: ") + r.error);
      reformed = std::max(reformed, r.t_ns);
    }
    std::printf(
        "{\"measure\":\"reform\",\"backend\":\"%s\",\"agents\":%d,\"rep\":%d,\"lease_ms\":%lld,"
        "\"reform_ms\":%.2f}\n",
        s.backend.c_str(), n, rep, static_cast<long long>(s.lease.count()),
        static_cast<double>(reformed - t_kill) / 1e6);
    std::fflush(stdout);
  }
  for (pid_t p : pids) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
  ::close(ready[0]);
  ::close(go[1]);
  ::close(res[0]);
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
  CLI::App app{"etcd_rdzv_bench: ddprun's rendezvous round on etcd v3 or a c10d store"};
  Setup s;
  std::string endpoints, agents = "4,16,64,256", tag = "x";
  int reps = 2, lease_ms = 2000;
  bool reform = false;
  app.add_option("--backend", s.backend, "etcd or c10d")
      ->required()
      ->check(CLI::IsMember({"etcd", "c10d"}));
  app.add_option("--endpoints", endpoints, "etcd members, or the ddprund's host:port")->required();
  app.add_option("--agents", agents, "comma list of agent counts")->capture_default_str();
  app.add_option("--reps", reps, "rounds per agent count")->capture_default_str();
  app.add_option("--reform", reform, "also kill one agent and time the re-form");
  app.add_option("--lease-ms", lease_ms, "liveness lease TTL (reform)")->capture_default_str();
  app.add_option("--tag", tag, "part of the run ids (a fresh key space per bench run)");
  app.add_option("--cacert", s.tls.cacert.path, "https members: their CA bundle (PEM)");
  app.add_option("--cert", s.tls.cert.path, "https members: the client certificate (PEM)");
  app.add_option("--key", s.tls.key.path, "https members: its key (PEM)");
  CLI11_PARSE(app, argc, argv);
  s.tls.cacert.from = "--cacert";
  s.tls.cert.from = "--cert";
  s.tls.key.from = "--key";
  rdzv::raise_fd_limit();
  s.endpoints = rdzv::etcd::parse_etcd_endpoints(endpoints, &s.tls.on);
  s.lease = std::chrono::milliseconds(lease_ms);
  ::signal(SIGPIPE, SIG_IGN);
  int run = 0;
  for (int n : parse_list(agents)) {
    if (n < 2 || n > 1024) {
      std::fprintf(stderr, "etcd_rdzv_bench: --agents %d is not in [2, 1024]\n", n);
      return 2;
    }
    for (int rep = 0; rep < reps; ++rep) {
      measure(s, n, reform, "bench-" + tag + "-" + std::to_string(run++), rep);
    }
  }
  return 0;
}
