// The real ports of the lifecycle loop (lifecycle.hpp): StoreRendezvous forms rounds over the
// agent's store (a stop signal interrupts it) and hosts, clears or finds the workers' store;
// LocalRound starts the workers (round_workers.hpp) and watches the round with one poll over
// pidfds, signalfds, the event watcher's eventfd and the output pipes. Private to the launcher.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp/launch/agent.hpp"
#include "ddp/launch/file_timer.hpp"
#include "ddp/launch/hang_monitor.hpp"
#include "ddp/launch/progress.hpp"
#include "ddp/launch/lifecycle.hpp"
#include "ddp/launch/liveness.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/status_reporter.hpp"
#include "ddp/launch/worker_group.hpp"
#include "ddp/launch/worker_output.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "store_access.hpp"

namespace ddp::launch {

// How long the nodes of a round have to say whether they carry running workers into it.
inline constexpr std::chrono::milliseconds kRegroupVoteTimeout{10000};

// The signal a signalfd holds; 0 when none.
int read_signal(int sigfd);
// Whether a signal is waiting on the signalfd (left unread).
bool signal_pending(int sigfd);

class StoreRendezvous final : public RendezvousPort {
 public:
  struct Setup {
    Rendezvous& rendezvous;
    rdzv::Store* client = nullptr;    // the TCP store's (null: etcd); clears worker keys
    std::function<void()> interrupt;  // a stop signal while a round forms: gives up
    int sigfd = -1;
    bool solo = false;         // a private one-node store: nothing can block
    bool hosts_store = false;  // this agent hosts the rendezvous store
    std::string store_host;
    std::uint16_t store_port = 0;
    AgentLiveness* liveness = nullptr;  // its will points at the round being joined
    std::string lost_will;
    // The workers' MASTER_ADDR (master_addr.hpp). With `agent_store_serves` (static, or solo)
    // the workers use the rendezvous store itself on store_port, as torchrun's do (static: the
    // --master-port the user gave); otherwise group rank 0 serves a store of the round's own,
    // listening on `workers_bind`.
    bool agent_store_serves = false;
    std::string workers_addr;
    std::string workers_bind;
    // Who may use the workers' store (store_access.hpp): the round's members' workers without
    // authenticating, others only with the job's secret. `store_server`: the rendezvous store
    // when this agent hosts it (static: it is the workers' store, so it admits them too).
    StoreAccess access;
    rdzv::StoreServer* store_server = nullptr;
    std::function<void()> on_stopping;  // the agent stops: stop waiting for an absent store
  };
  explicit StoreRendezvous(Setup setup) : s_(std::move(setup)) {}

  Formed form(const NodeDesc& self, int hint, int expect) override;
  void finished(const Round& round) override;
  RoundEvent end_round(const Round& round, const RoundEvent& event, bool reopen) override;
  void depart(const Round& round) override;
  void stopping() override {
    if (s_.on_stopping) s_.on_stopping();
  }
  int count_heals(const Round&, int add) override { return s_.rendezvous.count_heals(add); }
  int agree_regroup(const Round& round, bool carry) override {
    return s_.rendezvous.agree_regroup(round, carry, kRegroupVoteTimeout);
  }

 private:
  Setup s_;
  // c10d: the workers' store, hosted by group rank 0's agent for one round only, so keys of an
  // earlier round or another job can never be seen. Static and solo: the agent's store serves
  // them, and group rank 0 (its host) deletes the earlier rounds' worker keys before any
  // worker of the round starts.
  // Regrouping: workers carried into the next round still use the last round's store until
  // they read their regroup line; it goes at the round after.
  std::unique_ptr<rdzv::StoreServer> worker_store_;
  std::unique_ptr<rdzv::StoreServer> previous_worker_store_;
  std::string host_;
  std::vector<rdzv::Cidr> workers_networks(const Round& round);
};

class LocalRound final : public WorkerLauncher, public EventSource {
 public:
  struct Setup {
    const LaunchConfig& config;
    const EnvMap& agent_env;
    const AgentProcess& process;
    const RunLogDir& logs;
    const Rendezvous& rendezvous;  // names the round's event key
    std::chrono::milliseconds grace{30000};
    int sigfd = -1;   // stop signals
    int passfd = -1;  // signals passed on to the workers
    int chldfd = -1;  // SIGCHLD: orphans to reap
    std::string prefix_template;
    std::string host;
    int nproc = 1;
    bool solo = false;  // no event watcher
    // The round's event watcher on a connection of its own (the backend's).
    std::function<std::unique_ptr<EventWatcher>(const std::string& key)> make_watcher;
    // Hang and straggler detection (hang_monitor.hpp): its settings, torch's file timer (the
    // agent's, when enabled), and the rendezvous client the health bus uses from this thread
    // (null: the in-memory bus of a one-node job).
    HangSettings hang;
    FileTimerServer* timer = nullptr;
    rdzv::Store* health_store = nullptr;
    // The live status (status_reporter.hpp; null: none) and each local rank's GPU as NVML
    // numbers it (-1 or absent: none).
    StatusReporter* status = nullptr;
    std::vector<int> gpus;
  };
  explicit LocalRound(Setup setup) : s_(std::move(setup)) {}
  ~LocalRound() override {
    clear();
    unwatch();
  }

  std::string make_attempt(int restart_count) override;
  SpawnResult start(const GroupInfo& group) override;
  void stop(int sig) override;
  void finish() override;
  void remove_temporary_logs() override;
  void clear() override {
    monitor_.reset();
    progress_.reset();
    workers_.reset();
    pump_.reset();
  }

  std::string respawn(int local_rank, int heal) override;
  bool can_regroup() override;
  SpawnResult regroup(const GroupInfo& group, std::chrono::system_clock::time_point since) override;

  void open(const Round& round) override;
  int take_signal() override { return read_signal(s_.sigfd); }
  Observation wait() override;
  void unwatch() override { watcher_.reset(); }

 private:
  Setup s_;
  std::unique_ptr<EventWatcher> watcher_;
  std::unique_ptr<OutputPump> pump_;
  std::unique_ptr<WorkerGroup> workers_;
  std::unique_ptr<ProgressReader> progress_;
  std::unique_ptr<HangMonitor> monitor_;
  Round round_;
  GroupInfo group_;  // the round's, for a replacement's environment
  struct Heal {
    int local_rank;
    int heal;
    std::chrono::system_clock::time_point died;  // when the agent saw the death
    bool regroup = false;  // a running worker told its new place: done at its next step
  };
  std::vector<Heal> heals_;  // replacements yet to take their first step
  void check_heals();
  SteadyTime next_status_{};  // when the live status next takes the progress
  void start_monitor(const GroupInfo& group);
  void tell_started(const GroupInfo& group);
  void tell_status(const std::vector<WorkerExit>& exits, const Observation& o);
};

}  // namespace ddp::launch
