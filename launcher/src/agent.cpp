// The agent's lifecycle (see agent.hpp): open or join the rendezvous store, then one loop turn
// per rendezvous round: form the round, host or find the workers' store, start the workers
// (round_workers.hpp: a stop signal is seen between two forks), and wait on one poll set for
// whatever comes first: a worker's exit (pidfd), a stop signal (signalfd), the round's event
// posted by any node (EventWatcher's eventfd), or worker output; orphans are reaped on SIGCHLD.
// Nothing waits on a timer, so a failure anywhere reaches every node within a round trip.
#include "ddp/launch/agent.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "ddp/launch/descendants.hpp"
#include "ddp/launch/failure_report.hpp"
#include "ddp/launch/limits.hpp"
#include "ddp/launch/liveness.hpp"
#include "ddp/launch/rank_assignment.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/round_workers.hpp"
#include "ddp/launch/slurm_env.hpp"
#include "ddp/launch/worker_group.hpp"
#include "ddp/launch/worker_output.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/server.hpp"

#include "agent_store.hpp"

namespace ddp::launch {
namespace {

using std::chrono::milliseconds;

int count_nvidia_gpus() {
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

milliseconds seconds_setting(const std::map<std::string, std::string>& m, const std::string& key,
                             double fallback, const std::string& what) {
  auto it = m.find(key);
  if (it == m.end()) return milliseconds(static_cast<long>(fallback * 1000));
  try {
    std::size_t used = 0;
    double v = std::stod(it->second, &used);
    if (used != it->second.size() || !(v >= 0 && v <= kMaxSeconds))
      throw std::invalid_argument("x");
    return milliseconds(static_cast<long>(v * 1000));
  } catch (const std::exception&) {
    throw ConfigError(what + " '" + it->second + "' is not a number of seconds in [0, " +
                      std::to_string(static_cast<int>(kMaxSeconds)) + "]");
  }
}

// TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s), cut under Slurm to end before slurmstepd's SIGKILL
// at KillWait (from the slurm.conf in SLURM_CONF; Slurm's default 30 s when it says nothing).
milliseconds slurm_aware_grace(const std::map<std::string, std::string>& env) {
  auto grace =
      seconds_setting(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 30, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  if (!env.count("SLURM_JOB_ID") && !env.count("SLURM_JOBID")) return grace;
  auto conf = env.find("SLURM_CONF");
  std::ifstream in(conf != env.end() ? conf->second : "/etc/slurm/slurm.conf");
  std::stringstream text;
  text << in.rdbuf();
  const int kill_wait = parse_kill_wait(text.str()).value_or(30);
  auto capped = stop_grace(grace, kill_wait);
  if (capped < grace && env.count("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    std::fprintf(stderr,
                 "ddprun: TORCH_ELASTIC_SHUTDOWN_TIMEOUT cut to %.1f s to end before Slurm's "
                 "KillWait=%d s\n",
                 static_cast<double>(capped.count()) / 1000, kill_wait);
  }
  return capped;
}

int make_signalfd(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  // Blocked before any thread starts (threads inherit the mask), so only the signalfd sees
  // them; workers get an empty mask back before exec.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) throw IoError(std::string("signalfd failed: ") + std::strerror(errno));
  return fd;
}

// While the agent blocks on the store (forming a round), a stop signal must still stop it: a
// thread watches the signalfd and interrupts the store client, leaving the signal unread.
class SignalInterrupt {
 public:
  SignalInterrupt(int sigfd, rdzv::StoreClient& client) {
    stop_ = ::eventfd(0, EFD_CLOEXEC);
    if (stop_ < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
    thread_ = std::thread([this, sigfd, &client] {
      pollfd fds[2] = {{sigfd, POLLIN, 0}, {stop_, POLLIN, 0}};
      while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
      }
      if (fds[0].revents != 0 && fds[1].revents == 0) {
        fired_ = true;
        client.interrupt();
      }
    });
  }
  ~SignalInterrupt() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_, &one, sizeof(one));
    thread_.join();
    ::close(stop_);
  }
  SignalInterrupt(const SignalInterrupt&) = delete;
  SignalInterrupt& operator=(const SignalInterrupt&) = delete;
  bool fired() const { return fired_; }

 private:
  int stop_ = -1;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

int read_signal(int sigfd) {
  signalfd_siginfo si{};
  if (::read(sigfd, &si, sizeof(si)) != static_cast<ssize_t>(sizeof(si))) return 0;
  return static_cast<int>(si.ssi_signo);
}

// What ended one round's monitoring.
struct Outcome {
  enum class Kind { local_failure, signal, event, store_lost, spawn_error } kind;
  std::vector<Failure> failures;  // local_failure
  int signal = 0;
  RoundEvent event;
  std::string error;
};

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

int run_agent(const LaunchConfig& config, const EnvMap& agent_env, const AgentProcess& process) {
  const bool is_static = config.rdzv_backend == "static" && !config.standalone;
  if (is_static && config.min_nodes != config.max_nodes) {
    throw ConfigError("--nnodes=" + std::to_string(config.min_nodes) + ":" +
                      std::to_string(config.max_nodes) +
                      ": the static backend needs a fixed --nnodes=N (use --rdzv-backend=c10d "
                      "for MIN:MAX)");
  }
  if (is_static && config.node_rank >= config.max_nodes) {
    throw ConfigError("--node-rank=" + std::to_string(config.node_rank) + " is not below " +
                      "--nnodes=" + std::to_string(config.max_nodes));
  }
  const int nproc = resolve_nproc(config.nproc_per_node);
  check_nproc(nproc, config, read_machine_limits());
  const auto grace = slurm_aware_grace(agent_env);
  RendezvousOptions ro;
  ro.run_id = config.rdzv_id;
  ro.min_nodes = config.min_nodes;
  ro.max_nodes = config.max_nodes;
  ro.by_node_rank = is_static;
  ro.join_timeout =
      seconds_setting(config.rdzv_conf, "join_timeout", 600, "--rdzv-conf join_timeout");
  ro.last_call =
      seconds_setting(config.rdzv_conf, "last_call_timeout", 30, "--rdzv-conf last_call_timeout");
  const auto keep_alive = seconds_setting(config.rdzv_conf, "keep_alive_interval", 5,
                                          "--rdzv-conf keep_alive_interval");
  int keep_alive_attempts = 3;
  if (auto it = config.rdzv_conf.find("keep_alive_max_attempt"); it != config.rdzv_conf.end()) {
    const std::string& t = it->second;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), keep_alive_attempts);
    if (ec != std::errc() || end != t.data() + t.size() || keep_alive_attempts <= 0) {
      throw ConfigError("--rdzv-conf keep_alive_max_attempt '" + it->second +
                        "' is not a positive integer");
    }
  }
  if (keep_alive.count() <= 0) {
    throw ConfigError("--rdzv-conf keep_alive_interval must be > 0");
  }
  rdzv::ClientOptions co;
  co.timeout = seconds_setting(config.rdzv_conf, "read_timeout", 60, "--rdzv-conf read_timeout");
  co.connect_timeout = ro.join_timeout;
  const std::string prefix_template =
      config.log_line_prefix_template ? *config.log_line_prefix_template : kDefaultPrefixTemplate;
  (void)expand_prefix(prefix_template, {});  // a bad template fails before anything starts

  // A console that went away (ddprun ... | head) must not kill the agent and its job.
  ::signal(SIGPIPE, SIG_IGN);
  // A log file past RLIMIT_FSIZE fails with EFBIG (reported, the job goes on) instead.
  ::signal(SIGXFSZ, SIG_IGN);
  const int sigfd = make_signalfd(config.signals_to_handle);
  // Orphans of the workers' subtrees come to the agent (a subreaper): reaped as they exit.
  const int chldfd = make_signalfd({SIGCHLD});
  // SIGUSR1/SIGUSR2 (Slurm's --signal=USR1@60: "checkpoint soon") go to the workers and the
  // job goes on; their default action would kill the agent. Listed in --signals-to-handle they
  // stop the job instead, as torchrun's do.
  std::vector<int> passed_on;
  for (int s : {SIGUSR1, SIGUSR2}) {
    const auto& h = config.signals_to_handle;
    if (std::find(h.begin(), h.end(), s) == h.end()) passed_on.push_back(s);
  }
  const int passfd = make_signalfd(passed_on);
  RendezvousStore rs = open_rendezvous_store(config);
  auto store_ptr = connect_store(rs, co, sigfd);
  if (!store_ptr) {
    int sig = read_signal(sigfd);
    std::fprintf(stderr,
                 "ddprun: received signal %d (%s) while connecting to the rendezvous "
                 "store; stopping\n",
                 sig, strsignal(sig));
    return 128 + sig;
  }
  rdzv::StoreClient& store = *store_ptr;
  const bool solo = config.standalone && config.max_nodes == 1;
  if (!solo && !is_static) {
    if (rs.server) {
      store.set("/ddprun/" + config.rdzv_id + "/host",
                hostname() + " pid " + std::to_string(::getpid()));
    } else if (rs.port_taken) {
      check_shared_store(store, config.rdzv_id, rs);
    }
  }
  Rendezvous rdzv(store, ro);
  RunLogDir logs(config.log_dir, config.rdzv_id);
  if (nproc > 1 && !agent_env.count("OMP_NUM_THREADS")) {
    std::fprintf(stderr,
                 "ddprun: setting OMP_NUM_THREADS=1 for each worker (unset, nproc > 1); tune it "
                 "for your workload\n");
  }

  const std::string host = hostname();
  NodeDesc self;
  self.host = host;
  self.addr = !config.local_addr.empty()                    ? config.local_addr
              : (config.standalone || is_loopback(rs.host)) ? "127.0.0.1"
                                                            : host;
  self.pid = static_cast<int>(::getpid());
  self.nproc = nproc;
  self.role = config.role;
  self.node_rank = is_static ? config.node_rank : -1;
  int hint = -1;
  int expect = 0;
  // This agent's liveness in the store; a private one-node store needs none.
  std::unique_ptr<Liveness> liveness;
  std::string lost_will;
  if (!solo) {
    liveness = std::make_unique<Liveness>(rs.host, rs.port, keep_alive, keep_alive_attempts);
    RoundEvent lost;
    lost.kind = RoundEvent::Kind::lost;
    lost.host = host;
    lost.pid = self.pid;
    lost_will = encode(lost);
  }

  while (true) {
    Round round;
    // The workers' store: hosted by group rank 0's agent for this round only, so keys of an
    // earlier round or another job can never be seen.
    std::unique_ptr<rdzv::StoreServer> worker_store;
    GroupInfo g;
    {
      // Alone on a private store (--standalone, one node), nothing can block: no watcher
      // threads, and the workers share the agent's store (each attempt has its own prefix).
      std::optional<SignalInterrupt> on_signal;
      if (!solo) on_signal.emplace(sigfd, store);
      try {
        round = rdzv.next_round(self, hint, expect, [&](int r) {
          if (liveness) liveness->set_will(rdzv.event_key(r), lost_will);
        });
        if (solo) {
          g.master_addr = rs.host;
          g.master_port = rs.port;
        } else if (round.group_rank == 0) {
          worker_store = start_server(bind_address(self.addr), 0);
          g.master_addr = self.addr;
          g.master_port = worker_store->port();
          rdzv.publish_master(round, g.master_addr, g.master_port);
        } else {
          std::tie(g.master_addr, g.master_port) = rdzv.master(round);
        }
      } catch (const TimeoutError& e) {
        std::fprintf(stderr, "ddprun: %s\n", e.what());
        return 1;
      } catch (const SpareNotNeeded&) {
        std::fprintf(stderr,
                     "ddprun: the job finished while this node waited as a spare "
                     "(--nnodes max already reached); nothing to do\n");
        return 0;
      } catch (const IoError& e) {
        if (!on_signal || !on_signal->fired()) throw;
      }
      if (on_signal && on_signal->fired()) {
        int sig = read_signal(sigfd);
        std::fprintf(stderr, "ddprun: received signal %d (%s) during the rendezvous; stopping\n",
                     sig, strsignal(sig));
        return 128 + sig;
      }
    }
    g.group_rank = round.group_rank;
    g.group_world_size = round.group_world_size;
    g.base_global_rank = round.base_global_rank;
    g.world_size = round.world_size;
    g.local_world_size = nproc;
    g.base_role_rank = round.base_role_rank;
    g.role_world_size = round.role_world_size;
    g.restart_count = round.restart_count;
    g.run_id = config.rdzv_id;
    g.attempt_dir = logs.make_attempt(round.restart_count);  // rank dirs: when spawned

    std::unique_ptr<EventWatcher> watcher;
    if (!solo) watcher = std::make_unique<EventWatcher>(rs.host, rs.port, rdzv.event_key(round));
    OutputPump pump;
    // A SIGUSR1/2 that came while no worker ran (rendezvous, restart) is dropped: delivered now
    // it would reach the new workers before they can handle it, and kill them.
    while (int sig = read_signal(passfd)) {
      std::fprintf(stderr, "ddprun: signal %d (%s) came while no worker ran; dropped\n", sig,
                   strsignal(sig));
    }
    WorkerGroup workers({process.inherited_fds, process.nofile_soft});
    const SpawnResult spawned =
        spawn_workers({config, g, agent_env, prefix_template, host, nproc}, pump, workers, sigfd);

    // Monitor until something ends the round for this node.
    Outcome out{};
    bool decided = false, finished = false;
    if (!spawned.error.empty()) {
      out.kind = Outcome::Kind::spawn_error;
      out.error = spawned.error;
      decided = true;
    } else if (spawned.stop_signal) {
      out.kind = Outcome::Kind::signal;
      out.signal = read_signal(sigfd);
      decided = out.signal != 0;
    }
    constexpr std::size_t kFixed = 4;  // sigfd, watcher, passfd, chldfd; then pidfds, outputs
    while (!decided) {
      std::vector<pollfd> fds{{sigfd, POLLIN, 0},
                              {watcher ? watcher->fd() : -1, POLLIN, 0},
                              {passfd, POLLIN, 0},
                              {chldfd, POLLIN, 0}};
      const auto pidfds = workers.live_pidfds();
      for (int fd : pidfds) fds.push_back({fd, POLLIN, 0});
      const auto outs = pump.fds();
      for (int fd : outs) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        throw IoError(std::string("poll failed: ") + std::strerror(errno));
      }
      for (std::size_t i = kFixed + pidfds.size(); i < fds.size(); ++i) {
        if (fds[i].revents != 0) pump.on_readable(fds[i].fd);
      }
      if (fds[3].revents != 0) {
        while (read_signal(chldfd) != 0) {
        }
        reap_orphans(workers.pids());  // never a worker: WorkerGroup reaps those
      }
      if (fds[2].revents != 0) {
        if (int sig = read_signal(passfd); sig != 0) {
          std::fprintf(stderr, "ddprun: received signal %d (%s), passing it on to the workers\n",
                       sig, strsignal(sig));
          workers.signal_all(sig);
        }
      }
      if (fds[0].revents != 0) {
        if (int sig = read_signal(sigfd); sig != 0) {
          out.kind = Outcome::Kind::signal;
          out.signal = sig;
          decided = true;
          break;
        }
      }
      for (std::size_t i = 0; i < pidfds.size(); ++i) {
        if (fds[kFixed + i].revents == 0) continue;
        WorkerExit e = workers.reap_pidfd(pidfds[i]);
        if (!e.failed()) continue;
        Failure f;
        f.exit = e;
        f.global_rank = g.base_global_rank + e.local_rank;
        f.host = host;
        if (!g.attempt_dir.empty()) {
          f.error_file = g.attempt_dir + "/" + std::to_string(e.local_rank) + "/error.json";
        }
        out.failures.push_back(std::move(f));
      }
      if (!out.failures.empty()) {
        out.kind = Outcome::Kind::local_failure;
        decided = true;
        break;
      }
      if (!finished && workers.running() == 0) {
        finished = true;  // every local worker exited 0: wait for the others' outcome
        rdzv.finished(round, host, round.group_rank);
        if (solo) {
          out.kind = Outcome::Kind::event;
          out.event.kind = RoundEvent::Kind::done;
          decided = true;
        }
      }
      if (watcher && fds[1].revents != 0) {
        if (auto ev = watcher->event()) {
          out.kind = Outcome::Kind::event;
          out.event = *ev;
        } else {
          out.kind = Outcome::Kind::store_lost;
          out.error = watcher->error();
        }
        decided = true;
      }
    }

    const bool restarts_left = round.restart_count < config.max_restarts;
    // Leaving the job for good: the store's host stays until the others have left (bounded),
    // so none of them loses the store in the middle of its last request.
    auto depart = [&] {
      try {
        rdzv.leave(round);
        if (rs.server) rdzv.wait_all_left(round, milliseconds(10000));
      } catch (const Error&) {
        // the store is gone already: nobody left to wait for
      }
    };
    if (out.kind == Outcome::Kind::signal) {
      std::fprintf(stderr, "ddprun: received signal %d (%s), forwarding it to the workers\n",
                   out.signal, strsignal(out.signal));
      stop_round(workers, grace, out.signal, process.watcher);
      pump.drain();
      RoundEvent ev;
      ev.kind = RoundEvent::Kind::signal;
      ev.host = host;
      ev.group_rank = round.group_rank;
      ev.signal = out.signal;
      try {
        rdzv.end_round(round, ev, /*reopen=*/true);
      } catch (const Error&) {
        // The store is gone too; nobody is left to tell.
      }
      return 128 + out.signal;
    }
    if (out.kind == Outcome::Kind::store_lost) {
      stop_round(workers, grace, SIGTERM, process.watcher);
      pump.drain();
      std::fprintf(stderr,
                   "ddprun: lost the rendezvous store at %s:%u (%s); stopped the "
                   "workers\n",
                   rs.host.c_str(), rs.port, out.error.c_str());
      return 1;
    }
    RoundEvent ev = out.event;
    if (out.kind == Outcome::Kind::local_failure) {
      // The others were stopped by us: not failures of their own.
      stop_round(workers, grace, SIGTERM, process.watcher);
      pump.drain();
      for (auto& f : out.failures) {
        if (!f.error_file.empty()) f.reported = read_error_file(f.error_file);
      }
      std::sort(out.failures.begin(), out.failures.end(),
                [](const Failure& a, const Failure& b) { return a.time() < b.time(); });
      const Failure& first = out.failures.front();
      RoundEvent ours;
      ours.kind = RoundEvent::Kind::failure;
      ours.host = host;
      ours.group_rank = round.group_rank;
      ours.global_rank = first.global_rank;
      ours.local_rank = first.exit.local_rank;
      ours.exit_code = exit_code_for(out.failures);
      ours.what =
          first.exit.signal != 0 ? first.exit.describe() : "exit code " + first.exit.describe();
      ev = rdzv.end_round(round, ours, restarts_left);
      if (!restarts_left) {
        std::fputs(format_failure_summary(config.entrypoint, out.failures).c_str(), stderr);
        depart();
        return exit_code_for(out.failures);
      }
    } else if (out.kind == Outcome::Kind::spawn_error) {
      // A failure of this node, as a worker's would be: every node stops, or restarts.
      stop_round(workers, grace, SIGTERM, process.watcher);
      pump.drain();
      std::fprintf(stderr, "ddprun: %s; %s\n", out.error.c_str(),
                   restarts_left ? "restarting" : "stopping the job");
      RoundEvent ours;
      ours.kind = RoundEvent::Kind::failure;
      ours.host = host;
      ours.group_rank = round.group_rank;
      ours.local_rank = spawned.rank;
      ours.global_rank = g.base_global_rank + spawned.rank;
      ours.exit_code = 1;
      ours.what = "its log directory or file could not be created";
      ev = rdzv.end_round(round, ours, restarts_left);
      if (!restarts_left) {
        depart();
        return 1;
      }
    } else if (ev.kind == RoundEvent::Kind::done) {
      pump.drain();
      clear_leftovers(process.watcher);
      depart();
      logs.remove_if_temporary();
      return 0;
    } else {
      stop_round(workers, grace, SIGTERM, process.watcher);
      pump.drain();
    }
    // A failure or a stop elsewhere (or ours, with restarts left): the next round.
    if (ev.kind == RoundEvent::Kind::failure) {
      if (!restarts_left) {
        std::fprintf(stderr, "ddprun: stopping: %s; no restarts left (--max-restarts=%d)\n",
                     ev.describe().c_str(), config.max_restarts);
        depart();
        return ev.exit_code != 0 ? ev.exit_code : 1;
      }
      self.restart_count = round.restart_count + 1;
      std::fprintf(stderr, "ddprun: %s; restarting the workers of every node, restart %d of %d\n",
                   ev.describe().c_str(), self.restart_count, config.max_restarts);
    } else {
      self.restart_count = round.restart_count;  // not a failure: not counted
      std::fprintf(stderr, "ddprun: %s; re-forming the job (not counted as a restart)\n",
                   ev.describe().c_str());
    }
    expect = next_round_expect(ev, round.group_world_size, config.max_nodes);
    self.prev_group_rank = round.group_rank;
    hint = round.number + 1;
  }
}

}  // namespace ddp::launch
