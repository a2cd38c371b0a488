// The agent's lifecycle for a single node (see agent.hpp). Worker exits arrive through
// WorkerGroup's pidfds; the stop signals are blocked and collected with sigtimedwait between
// waits, so a forwarded signal takes at most --monitor-interval to act on.
#include "ddp/launch/agent.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "ddp/launch/failure_report.hpp"
#include "ddp/launch/worker_group.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/server.hpp"

namespace ddp::launch {
namespace {

int count_nvidia_gpus() {
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

std::chrono::milliseconds shutdown_grace(const EnvMap& env) {
  auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  if (it == env.end()) return std::chrono::seconds(30);
  try {
    return std::chrono::milliseconds(static_cast<long>(std::stod(it->second) * 1000));
  } catch (const std::exception&) {
    throw ConfigError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='" + it->second + "' is not a number");
  }
}

std::string hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

int resolve_nproc(const std::string& spec) {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (spec == "cpu") return cores;
  if (spec == "gpu" || spec == "auto") {
    int gpus = count_nvidia_gpus();
    if (gpus > 0) return gpus;
    if (spec == "gpu") throw ConfigError("--nproc-per-node=gpu: no NVIDIA GPU is visible");
    return cores;
  }
  return std::stoi(spec);
}

int run_agent(const LaunchConfig& config, const EnvMap& agent_env) {
  if (config.max_nodes != 1) {
    throw ConfigError("--nnodes=" + std::to_string(config.min_nodes) + ":" +
                      std::to_string(config.max_nodes) +
                      ": this ddprun runs single-node jobs only so far (multi-node rendezvous "
                      "is in progress)");
  }
  const int nproc = resolve_nproc(config.nproc_per_node);
  const auto grace = shutdown_grace(agent_env);

  // Blocked before any thread starts (the store's loop inherits the mask), so only the
  // sigtimedwait below ever sees them; workers get an empty mask back before exec.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int s : config.signals_to_handle) sigaddset(&stop_signals, s);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The store the workers' init_process_group("env://") connects to, hosted in this agent on
  // a free port (no fixed port: two jobs on one host never collide).
  rdzv::ServerOptions so;
  so.host = config.local_addr.empty() ? "127.0.0.1" : config.local_addr;
  so.port = 0;
  so.threads = 1;
  rdzv::StoreServer store(so);
  store.start();

  EnvMap env = agent_env;
  if (nproc > 1 && !env.count("OMP_NUM_THREADS")) {
    std::fprintf(stderr,
                 "ddprun: setting OMP_NUM_THREADS=1 for each worker (unset, nproc > 1); tune it "
                 "for your workload\n");
  }
  GroupInfo g;
  g.local_world_size = nproc;
  g.world_size = nproc;
  g.role_world_size = nproc;
  g.master_addr = so.host;
  g.master_port = store.port();
  g.run_id = config.rdzv_id;

  const auto monitor = std::chrono::milliseconds(
      std::max<long>(1, static_cast<long>(config.monitor_interval_s * 1000)));
  for (int attempt = 0;; ++attempt) {
    g.restart_count = attempt;
    std::vector<WorkerSpec> specs;
    for (int r = 0; r < nproc; ++r) {
      specs.push_back({worker_argv(config, r, env), worker_env(config, g, r, env)});
    }
    WorkerGroup workers;
    workers.start(specs);
    std::vector<Failure> failures;
    int received = 0;
    while (workers.running() > 0 && failures.empty() && received == 0) {
      if (auto e = workers.wait_any(monitor)) {
        if (e->failed()) {
          Failure f;
          f.exit = *e;
          f.global_rank = g.base_global_rank + e->local_rank;
          f.host = hostname();
          failures.push_back(std::move(f));
        }
        continue;
      }
      timespec zero{0, 0};
      int sig = sigtimedwait(&stop_signals, nullptr, &zero);
      if (sig > 0) received = sig;
    }
    if (received != 0) {
      std::fprintf(stderr, "ddprun: received signal %d (%s), forwarding it to the workers\n",
                   received, strsignal(received));
      workers.stop(grace, received);
      return 128 + received;
    }
    if (failures.empty()) return 0;  // every worker exited 0
    workers.stop(grace);             // the others were stopped by us: not failures of their own
    if (attempt < config.max_restarts) {
      std::fprintf(stderr, "ddprun: local rank %d failed (%s); restarting the group, %d of %d\n",
                   failures[0].exit.local_rank, failures[0].exit.describe().c_str(), attempt + 1,
                   config.max_restarts);
      continue;
    }
    std::string name = config.entrypoint;
    std::fputs(format_failure_summary(name, failures).c_str(), stderr);
    return exit_code_for(failures);
  }
}

}  // namespace ddp::launch
