// The agent for one node (agent.hpp): checks the configuration and reads its settings, sets
// up the signals (stop signals on a signalfd, SIGUSR1/2 passed on, SIGCHLD for orphans), opens
// or joins the rendezvous store, then hands the rounds to the lifecycle loop (lifecycle.hpp)
// with the real ports (agent_ports.hpp): the decisions themselves are policy.hpp's.
#include "ddp/launch/agent.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
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

#include "ddp/launch/agent_etcd.hpp"
#include "ddp/launch/gpu_devices.hpp"
#include "ddp/launch/gpu_job_mapping.hpp"
#include "ddp/launch/lifecycle.hpp"
#include "ddp/launch/limits.hpp"
#include "ddp/launch/liveness.hpp"
#include "ddp/launch/outage.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/resilient_store.hpp"
#include "ddp/launch/slurm_env.hpp"
#include "ddp/launch/status_reporter.hpp"
#include "ddp/launch/store_clients.hpp"
#include "ddp/launch/worker_output.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"
#include "ddp/proto/number.hpp"
#include "ddp/rdzv/store_tls.hpp"

#include "agent_ports.hpp"
#include "agent_status.hpp"
#include "agent_store.hpp"

namespace ddp::launch {
namespace {

using std::chrono::milliseconds;

// How long one WAIT of the round watcher lasts before it is renewed: a store that stopped
// answering is noticed (and shown as an outage) within about this plus a reply timeout.
constexpr milliseconds kWatchSlice{30000};

// The CPUs this process may run on, as torch._utils.cpu_count() (len(sched_getaffinity(0))).
int usable_cpus() {
  for (std::size_t n = CPU_SETSIZE;; n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    const std::size_t bytes = CPU_ALLOC_SIZE(n);
    const int rc = ::sched_getaffinity(0, bytes, set);
    const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return std::max(1, count);
    if (errno != EINVAL || n > (1u << 20)) {
      return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }
  }
}

milliseconds seconds_setting(const std::map<std::string, std::string>& m, const std::string& key,
                             double fallback, const std::string& what) {
  auto it = m.find(key);
  if (it == m.end()) return milliseconds(static_cast<long>(fallback * 1000));
  return parse_seconds(it->second, what, 0, kMaxSeconds);
}

// --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s (torchrun's order), cut
// under Slurm to end before slurmstepd's SIGKILL at KillWait (from the slurm.conf in
// SLURM_CONF; Slurm's default 30 s when it says nothing).
milliseconds slurm_aware_grace(const LaunchConfig& config,
                               const std::map<std::string, std::string>& env) {
  const milliseconds grace =
      config.shutdown_timeout_s
          ? milliseconds(static_cast<long>(*config.shutdown_timeout_s) * 1000)
          : milliseconds(
                static_cast<long>(knobs::seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &env) * 1000));
  if (!knobs::text("SLURM_JOB_ID", &env) && !knobs::text("SLURM_JOBID", &env)) return grace;
  std::ifstream in(knobs::text("SLURM_CONF", &env).value_or("/etc/slurm/slurm.conf"));
  std::stringstream text;
  text << in.rdbuf();
  const int kill_wait = parse_kill_wait(text.str()).value_or(30);
  auto capped = stop_grace(grace, kill_wait);
  if (capped < grace &&
      (config.shutdown_timeout_s || knobs::text("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &env))) {
    std::fprintf(
        stderr, "ddprun: %s cut to %.1f s to end before Slurm's KillWait=%d s\n",
        config.shutdown_timeout_s ? "--shutdown-timeout" : "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
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

}  // namespace

int resolve_nproc(const std::string& spec, const EnvMap& env) {
  if (spec == "cpu") return usable_cpus();
  if (spec == "gpu" || spec == "auto") {
    const auto machine = machine_gpus(nvidia_gpus_dir(env));
    const auto gpus = visible_gpus(machine, env);
    if (!gpus.empty()) return static_cast<int>(gpus.size());
    if (spec == "auto") return usable_cpus();
    throw ConfigError(
        "--nproc-per-node=gpu: no NVIDIA GPU is visible (" +
        (machine.empty()
             ? "the driver lists none in " + nvidia_gpus_dir(env)
             : "CUDA_VISIBLE_DEVICES='" + knobs::text("CUDA_VISIBLE_DEVICES", &env).value_or("") +
                   "' leaves none of this machine's " + std::to_string(machine.size())) +
        "); give --nproc-per-node=N or cpu");
  }
  return std::stoi(spec);
}

int run_agent(const LaunchConfig& config, const EnvMap& agent_env, const AgentProcess& process) {
  const bool is_static = config.rdzv_backend == "static" && !config.private_store;
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
  const int nproc = resolve_nproc(config.nproc_per_node, agent_env);
  if (auto note = check_worker_env_options(config, nproc, agent_env); !note.empty()) {
    std::fprintf(stderr, "ddprun: %s\n", note.c_str());
  }
  check_nproc(nproc, config, read_machine_limits());
  const auto grace = slurm_aware_grace(config, agent_env);
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
    keep_alive_attempts = static_cast<int>(
        parse_int(it->second, "--rdzv-conf keep_alive_max_attempt", 1, kMaxKeepAliveAttempts));
  }
  if (keep_alive.count() <= 0) {
    throw ConfigError("--rdzv-conf keep_alive_interval must be > 0");
  }
  // The job's secret (docs/security.md): the stores this agent hosts demand it of peers outside
  // their trusted networks, and every connection of the agent answers a store's challenge.
  // With DDPRUN_STORE_TLS_* (store_tls.hpp) they serve TLS, and every connection speaks it.
  const rdzv::StoreTls tls = rdzv::store_tls();
  StoreAccess access{
      proto::auth::job_secret().value_or(""), config.store_allow, config.store_allow_uids,
      tls.files.on ? std::make_shared<const rdzv::TlsContext>(tls.files, rdzv::TlsRole::server)
                   : nullptr,
      tls.only};
  const StoreClients clients = store_clients(
      seconds_setting(config.rdzv_conf, "read_timeout", 60, "--rdzv-conf read_timeout"),
      ro.join_timeout, keep_alive * keep_alive_attempts,
      milliseconds(static_cast<long>(config.store_outage_grace_s * 1000)), access.secret,
      tls.files.on ? std::make_shared<const rdzv::TlsContext>(tls.files) : nullptr);
  const rdzv::ClientOptions& co = clients.rendezvous;
  const std::string prefix_template =
      config.log_line_prefix_template ? *config.log_line_prefix_template : kDefaultPrefixTemplate;

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
  // The workers' MASTER_ADDR: torchrun's (static: the endpoint's host as written; c10d:
  // --local-addr, else the fqdn), kept on loopback for a job confined to this machine.
  const bool confined = config.private_store || is_loopback(config.endpoint().host);
  const WorkersAddr workers = is_static
                                  ? WorkersAddr{static_master_addr(config.endpoint().host), ""}
                                  : workers_addr(config.local_addr, confined);
  // The rendezvous store: a TCP store (hosted here or joined), or the etcd cluster (etcd-v3).
  RendezvousStore rs;
  std::unique_ptr<rdzv::StoreClient> tcp_store;
  std::unique_ptr<InterruptibleEtcdStore> etcd_store;
  std::optional<EtcdSettings> etcd;
  if (config.etcd()) {
    etcd = etcd_settings(config, co.timeout);
    etcd_store = open_etcd_store(*etcd, "/ddprun/" + config.rdzv_id);
  } else {
    tcp_store = host_or_join(rs, config, workers.bind, access, co, sigfd);
    if (!tcp_store) {
      int sig = read_signal(sigfd);
      std::fprintf(stderr,
                   "ddprun: received signal %d (%s) while connecting to the rendezvous "
                   "store; stopping\n",
                   sig, strsignal(sig));
      return 128 + sig;
    }
  }
  const bool solo = config.private_store && config.max_nodes == 1;
  if (!solo && !is_static && tcp_store) {
    if (rs.server) {
      tcp_store->set("/ddprun/" + config.rdzv_id + "/host",
                     hostname() + " pid " + std::to_string(::getpid()));
    } else if (rs.port_taken) {
      check_shared_store(*tcp_store, config.rdzv_id, rs);
    }
  }
  // An unreachable store (restarted, stopped, cut off) does not stop the job: the agent's
  // connections reconnect and the workers go on, within --store-outage-grace (docs/
  // rendezvous.md, "When the store goes away"). The account of the outages feeds the live
  // status (set below, once it exists).
  StatusReporter* status_of_outages = nullptr;
  OutageMonitor outages(
      etcd ? "etcd " + rdzv::etcd::endpoints_text(etcd->options.endpoints)
           : rdzv::Endpoint{rs.host, rs.port}.str(),
      milliseconds(static_cast<long>(config.store_outage_grace_s * 1000)),
      {[](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
       [&status_of_outages](const OutageSummary& s) {
         if (status_of_outages) status_of_outages->store_outage(s.count, s.total_s, s.away_s);
       }});
  Rendezvous* republisher = nullptr;  // puts back what a store that came back empty lost
  auto republish = [&republisher](rdzv::Store& s) {
    if (republisher) republisher->republish(s);
  };
  const auto seed =
      static_cast<std::uint64_t>(::getpid()) ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  // A connection that rides out the store's outages: to the TCP store with `o`'s settings, or
  // to the etcd cluster with `o`'s timeout.
  auto links = [&](const rdzv::ClientOptions& o) {
    return etcd ? etcd_links(*etcd, o.timeout) : tcp_links(dialer(rs.host, rs.port, o));
  };
  auto resilient = [&](const rdzv::ClientOptions& o, const char* who, int cancel_fd,
                       StoreLink first) {
    ResilientStore::Setup rs_setup;
    rs_setup.connect = links(o);
    rs_setup.monitor = &outages;
    rs_setup.who = who;
    rs_setup.cancel_fd = cancel_fd;
    rs_setup.on_reconnect = republish;
    rs_setup.seed = seed ^ std::hash<std::string>{}(who);
    return std::make_unique<ResilientStore>(std::move(rs_setup), std::move(first));
  };
  rdzv::ClientOptions etcd_co = co;  // the etcd cluster's requests: --rdzv-conf read_timeout
  if (etcd) etcd_co.timeout = etcd->options.timeout;
  std::unique_ptr<ResilientStore> main_store =
      resilient(etcd ? etcd_co : co, "rendezvous", sigfd,
                etcd ? etcd_link(std::move(etcd_store)) : tcp_link(std::move(tcp_store)));
  rdzv::Store& store = *main_store;
  ro.where =
      etcd ? "the etcd cluster " + config.rdzv_endpoint : rdzv::Endpoint{rs.host, rs.port}.str();
  ro.on_wait = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  if (rs.server && !is_static) {
    // `ddprun status` needs the store's address; a --standalone job's port is chosen here.
    std::fprintf(stderr,
                 "ddprun: rendezvous store on %s (run id %s%s); follow the job with: ddprun "
                 "status --rdzv-endpoint %s --run-id %s\n",
                 ro.where.c_str(), config.rdzv_id.c_str(),
                 !access.tls       ? ""
                 : access.tls_only ? ", TLS only"
                                   : ", TLS and plain",
                 ro.where.c_str(), config.rdzv_id.c_str());
  }
  Rendezvous rdzv(store, ro);
  republisher = &rdzv;
  RunLogDir logs(config.log_dir, config.rdzv_id);
  // Output the user asked to have in files is never deleted, even in a temporary folder.
  auto writes_files = [](const StdSpec& s) {
    bool any = s.all_ranks && *s.all_ranks != Std::none;
    for (const auto& [rank, std] : s.per_rank) any = any || std != Std::none;
    return any;
  };
  if (writes_files(config.redirects) || writes_files(config.tee)) logs.keep();
  if (nproc > 1 && !agent_env.count("OMP_NUM_THREADS")) {
    std::fprintf(stderr,
                 "ddprun: setting OMP_NUM_THREADS=1 for each worker (unset, nproc > 1); tune it "
                 "for your workload\n");
  }

  const std::string host = hostname();
  NodeDesc self;
  self.host = host;
  self.addr = workers.master_addr;
  self.pid = static_cast<int>(::getpid());
  self.nproc = nproc;
  self.role = config.role;
  self.node_rank = is_static ? config.node_rank : -1;
  if (!solo) self.ips = interface_addresses();
  // This agent's liveness in the store; a private one-node store needs none.
  std::unique_ptr<AgentLiveness> liveness;
  std::string lost_will;
  if (etcd) {
    liveness =
        std::make_unique<EtcdLiveness>(*etcd, rdzv.prefix(), keep_alive, keep_alive_attempts);
  } else if (!solo) {
    liveness = std::make_unique<Liveness>(dialer(rs.host, rs.port, clients.liveness), keep_alive,
                                          keep_alive_attempts);
  }
  if (!solo) {
    RoundEvent lost;
    lost.kind = RoundEvent::Kind::lost;
    lost.host = host;
    lost.pid = self.pid;
    lost_will = encode(lost);
  }

  // Static and solo: the workers use the agent's store (static: on --master-port, as torchrun).
  std::function<void()> interrupt = [&] { main_store->interrupt(); };
  StoreRendezvous rounds({rdzv, etcd ? nullptr : main_store.get(), interrupt, sigfd, solo,
                          rs.server != nullptr, rs.host, rs.port, liveness.get(), lost_will,
                          is_static || solo, workers.master_addr, workers.bind, access,
                          rs.server.get(), [&] { main_store->stop_waiting(); }});
  // The round's event, watched on a connection of its own.
  auto make_watcher = [&](const std::string& key) -> std::unique_ptr<EventWatcher> {
    auto watch = resilient(etcd ? etcd_co : clients.watcher, "watcher", -1, {});
    ResilientStore* w = watch.get();
    return std::make_unique<EventWatcher>(
        std::move(watch), [w] { w->interrupt(); }, key, kWatchSlice);
  };
  // The hang monitor's bus: never holds up the agent's loop while the store is away.
  std::unique_ptr<ResilientStore> health_store;
  if (!solo) {
    ResilientStore::Setup hs;
    rdzv::ClientOptions quick = etcd ? etcd_co : co;  // a reply within 2 s, or none this turn
    quick.timeout = std::min(quick.timeout, milliseconds(2000));
    hs.connect = links(quick);
    hs.monitor = &outages;
    hs.who = "health";
    hs.report = false;
    hs.impatient = true;
    health_store = std::make_unique<ResilientStore>(std::move(hs));
  }
  // torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): served here, its FIFO named to the
  // workers as torchrun does.
  const auto timer = FileTimerServer::from_env(agent_env);
  EnvMap workers_env = agent_env;
  if (timer) workers_env["TORCHELASTIC_TIMER_FILE"] = timer->path();
  HangSettings hang;
  hang.timeout_s = config.hang_timeout_s;
  hang.action = parse_on_hang(config.on_hang);
  hang.straggler_factor = config.straggler_factor;
  // The live status: published to the rendezvous store, served with --http-port.
  StatusReporter status(status_setup(config, agent_env, rs, workers, clients.status, etcd));
  status_of_outages = &status;
  struct Unhook {  // the outage account outlives the status: it stops telling it first
    StatusReporter*& hook;
    ~Unhook() { hook = nullptr; }
  } unhook{status_of_outages};
  status.start();
  LocalRound::Setup ls{config,
                       workers_env,
                       process,
                       logs,
                       rdzv,
                       grace,
                       sigfd,
                       passfd,
                       chldfd,
                       prefix_template,
                       host,
                       nproc,
                       solo,
                       make_watcher,
                       hang,
                       timer.get(),
                       health_store.get(),
                       &status,
                       nvml_indices(agent_env)};
  LocalRound local(ls);
  // DCGM's job mapping: the job's id in the files of the GPUs its workers use, while it runs
  // (worker i uses the i-th visible GPU, as torch's cuda:LOCAL_RANK).
  std::optional<GpuJobMapping> gpu_jobs;
  if (!config.gpu_job_mapping_dir.empty()) {
    auto gpus = nvml_indices(agent_env);
    gpus.resize(std::min(gpus.size(), static_cast<std::size_t>(nproc)));
    gpu_jobs.emplace(config.gpu_job_mapping_dir,
                     knobs::text("SLURM_JOB_ID", &agent_env).value_or(config.rdzv_id), gpus);
  }
  LifecycleConfig lc;
  lc.self = self;
  lc.run_id = config.rdzv_id;
  lc.entrypoint = config.entrypoint;
  lc.store_where = etcd ? "etcd " + rdzv::etcd::endpoints_text(etcd->options.endpoints)
                        : rs.host + ":" + std::to_string(rs.port);
  lc.nproc = nproc;
  lc.max_restarts = config.max_restarts;
  lc.max_nodes = config.max_nodes;
  lc.elastic = config.min_nodes < config.max_nodes;
  lc.solo = solo;
  lc.status = &status;
  return run_lifecycle(lc, rounds, local, local);
}

}  // namespace ddp::launch
