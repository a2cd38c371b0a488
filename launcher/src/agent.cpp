// The agent's lifecycle (see agent.hpp): open or join the rendezvous store, then one loop turn
// per rendezvous round: form the round, host or find the workers' store, start the workers,
// and wait on one poll set for whatever comes first: a worker's exit (pidfd), a stop signal
// (signalfd), the round's event posted by any node (EventWatcher's eventfd), or worker output.
// Nothing waits on a timer, so a failure anywhere reaches every node within a round trip.
#include "ddp/launch/agent.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
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

#include "ddp/launch/failure_report.hpp"
#include "ddp/launch/liveness.hpp"
#include "ddp/launch/rank_assignment.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/slurm_env.hpp"
#include "ddp/launch/worker_group.hpp"
#include "ddp/launch/worker_output.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/server.hpp"

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
    if (used != it->second.size() || v < 0) throw std::invalid_argument("x");
    return milliseconds(static_cast<long>(v * 1000));
  } catch (const std::exception&) {
    throw ConfigError(what + " '" + it->second + "' is not a number of seconds >= 0");
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

std::string hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// torch's is_host heuristic: the endpoint names this machine (a loopback name, the hostname,
// or an address of one of its interfaces).
bool names_this_machine(const std::string& host) {
  if (is_loopback(host) || host == hostname()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  ifaddrs* ifs = nullptr;
  bool match = false;
  if (::getifaddrs(&ifs) == 0) {
    for (auto* a = res; a && !match; a = a->ai_next) {
      for (auto* i = ifs; i && !match; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != a->ai_family) continue;
        if (a->ai_family == AF_INET) {
          match = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr ==
                  reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
        } else if (a->ai_family == AF_INET6) {
          match = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
                              &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                              sizeof(in6_addr)) == 0;
        }
      }
    }
    ::freeifaddrs(ifs);
  }
  ::freeaddrinfo(res);
  return match;
}

// The address a server binds for `host`: loopback stays loopback; anything else listens on
// every interface, as torch's TCPStore does.
std::string bind_address(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  if (is_loopback(host)) return host;
  return "0.0.0.0";
}

struct RendezvousStore {
  std::unique_ptr<rdzv::StoreServer> server;  // when this agent hosts it
  std::string host;                           // where to connect
  std::uint16_t port = 0;
  bool port_taken = false;  // we meant to host it, but something else holds the port
};

std::unique_ptr<rdzv::StoreServer> start_server(const std::string& bind, std::uint16_t port) {
  rdzv::ServerOptions so;
  so.host = bind;
  so.port = port;
  so.threads = 1;
  auto s = std::make_unique<rdzv::StoreServer>(so);
  s->start();
  return s;
}

RendezvousStore open_rendezvous_store(const LaunchConfig& config) {
  RendezvousStore rs;
  if (config.standalone) {  // a private store on a free port: two jobs never collide
    rs.server = start_server("127.0.0.1", 0);
    rs.host = "127.0.0.1";
    rs.port = rs.server->port();
    return rs;
  }
  Endpoint ep = config.endpoint();
  rs.host = ep.host;
  rs.port = ep.port;
  if (config.rdzv_backend == "static") {
    if (config.node_rank != 0) return rs;
    try {
      rs.server = start_server(bind_address(ep.host), ep.port);
    } catch (const Error& e) {
      throw ConfigError("--node-rank=0 hosts the rendezvous store on " + ep.host + ":" +
                        std::to_string(ep.port) + ", but " + e.what() +
                        "; is another agent running with --node-rank=0, or another job on "
                        "this --master-port?");
    }
    return rs;
  }
  auto it = config.rdzv_conf.find("is_host");
  bool told = it != config.rdzv_conf.end();
  bool is_host = told ? (it->second == "1" || it->second == "true" || it->second == "True")
                      : names_this_machine(ep.host);
  if (!is_host) return rs;
  try {
    rs.server = start_server(bind_address(ep.host), ep.port);
  } catch (const Error&) {
    if (told) throw;  // is_host=true: hosting is required
    // Another agent of this job on this machine, a ddprund, or something else: told apart
    // once connected (check_shared_store).
    rs.port_taken = true;
  }
  return rs;
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

// Connects to the rendezvous store, which may not be up yet (another node hosts it), trying
// for up to co.connect_timeout in slices of a second so that a stop signal ends the wait.
// Returns null when a signal arrived (left unread for the caller).
std::unique_ptr<rdzv::StoreClient> connect_store(const RendezvousStore& rs, rdzv::ClientOptions co,
                                                 int sigfd) {
  const auto give_up = std::chrono::steady_clock::now() + co.connect_timeout;
  while (true) {
    auto left =
        std::chrono::duration_cast<milliseconds>(give_up - std::chrono::steady_clock::now());
    auto slice = co;
    slice.connect_timeout = std::clamp(left, milliseconds(1), milliseconds(1000));
    try {
      return std::make_unique<rdzv::StoreClient>(rs.host, rs.port, slice);
    } catch (const Error& e) {
      if (std::string(e.what()).find("closed the connection") != std::string::npos) {
        throw ConfigError("the rendezvous endpoint " + rs.host + ":" + std::to_string(rs.port) +
                          " answers, but it is not a ddprun store (a torchrun job's TCPStore "
                          "on that port?); choose another --rdzv-endpoint port");
      }
      if (left <= milliseconds(1000)) {
        throw IoError("cannot reach the rendezvous store at " + rs.host + ":" +
                      std::to_string(rs.port) + " within the join timeout (" +
                      std::to_string(co.connect_timeout.count() / 1000) + " s); is the node " +
                      "that hosts it (node rank 0, or the endpoint's host) running? Last " +
                      "error: " + e.what());
      }
    }
    pollfd p{sigfd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) return nullptr;
  }
}

// When this agent could not host the store because the port was taken: join only a store that
// an agent of this job hosts, or a plain one (a ddprund); refuse another job's agent store
// instead of silently joining that job (torch's fallback).
void check_shared_store(rdzv::StoreClient& store, const std::string& run_id,
                        const RendezvousStore& rs) {
  const std::string mine = "/ddprun/" + run_id + "/host";
  // The agent that won the port writes its key right after binding; give it a moment.
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (store.check({mine})) return;  // an agent of this job hosts it
    for (const auto& k : store.list_keys()) {
      if (k.rfind("/ddprun/", 0) == 0 && k.size() > 13 &&
          k.compare(k.size() - 5, 5, "/host") == 0) {
        std::string other = k.substr(8, k.size() - 13);
        throw ConfigError("the rendezvous endpoint " + rs.host + ":" + std::to_string(rs.port) +
                          " is the store of another job (run id '" + other + "', hosted by " +
                          store.get(k) + "), not of run id '" + run_id +
                          "'; choose a free --rdzv-endpoint port, or the same --rdzv-id if "
                          "the two are one job");
      }
    }
    std::this_thread::sleep_for(milliseconds(25));
  }
  // No agent hosts it: a plain store (a ddprund), shared by design.
}

// What ended one round's monitoring.
struct Outcome {
  enum class Kind { local_failure, signal, event, store_lost } kind;
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

int run_agent(const LaunchConfig& config, const EnvMap& agent_env) {
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
  const int sigfd = make_signalfd(config.signals_to_handle);
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
    g.attempt_dir = logs.make_attempt(round.restart_count, nproc);

    std::unique_ptr<EventWatcher> watcher;
    if (!solo) watcher = std::make_unique<EventWatcher>(rs.host, rs.port, rdzv.event_key(round));
    OutputPump pump;
    std::vector<WorkerSpec> specs;
    for (int r = 0; r < nproc; ++r) {
      WorkerSpec spec{worker_argv(config, r, agent_env), worker_env(config, g, r, agent_env)};
      const auto& f = config.local_ranks_filter;
      bool shown = f.empty() || std::find(f.begin(), f.end(), r) != f.end();
      PrefixVars pv{config.role, r, g.base_global_rank + r, g.group_rank, host};
      pump.attach(spec, r, expand_prefix(prefix_template, pv), config.redirects.for_rank(r),
                  config.tee.for_rank(r), shown,
                  g.attempt_dir.empty() ? "" : g.attempt_dir + "/" + std::to_string(r));
      specs.push_back(std::move(spec));
    }
    // A SIGUSR1/2 that came while no worker ran (rendezvous, restart) is dropped: delivered now
    // it would reach the new workers before they can handle it, and kill them.
    while (int sig = read_signal(passfd)) {
      std::fprintf(stderr, "ddprun: signal %d (%s) came while no worker ran; dropped\n", sig,
                   strsignal(sig));
    }
    WorkerGroup workers;
    workers.start(specs);
    pump.after_start();

    // Monitor until something ends the round for this node.
    Outcome out{};
    bool decided = false, finished = false;
    while (!decided) {
      std::vector<pollfd> fds{
          {sigfd, POLLIN, 0}, {watcher ? watcher->fd() : -1, POLLIN, 0}, {passfd, POLLIN, 0}};
      const auto pidfds = workers.live_pidfds();
      for (int fd : pidfds) fds.push_back({fd, POLLIN, 0});
      const auto outs = pump.fds();
      for (int fd : outs) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        throw IoError(std::string("poll failed: ") + std::strerror(errno));
      }
      for (std::size_t i = 3 + pidfds.size(); i < fds.size(); ++i) {
        if (fds[i].revents != 0) pump.on_readable(fds[i].fd);
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
        if (fds[3 + i].revents == 0) continue;
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
      workers.stop(grace, out.signal);
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
      workers.stop(grace);
      pump.drain();
      std::fprintf(stderr,
                   "ddprun: lost the rendezvous store at %s:%u (%s); stopped the "
                   "workers\n",
                   rs.host.c_str(), rs.port, out.error.c_str());
      return 1;
    }
    RoundEvent ev = out.event;
    if (out.kind == Outcome::Kind::local_failure) {
      workers.stop(grace);  // the others were stopped by us: not failures of their own
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
    } else if (ev.kind == RoundEvent::Kind::done) {
      pump.drain();
      depart();
      logs.remove_if_temporary();
      return 0;
    } else {
      workers.stop(grace);
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
