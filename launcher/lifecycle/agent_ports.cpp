// The real lifecycle ports (agent_ports.hpp): rounds over the agent's store, and one round's
// workers watched by a single poll (pidfds, signalfds, the event watcher, output pipes).
// Nothing waits on a timer, so a failure anywhere reaches every node within a round trip.
#include "agent_ports.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "ddp/launch/descendants.hpp"
#include "ddp/launch/round_workers.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/regroup.hpp"

#include "agent_store.hpp"

namespace ddp::launch {

namespace {

// While the agent blocks on the store (forming a round), a stop signal must still stop it: a
// thread watches the signalfd and interrupts the store client, leaving the signal unread.
class SignalInterrupt {
 public:
  SignalInterrupt(int sigfd, std::function<void()> interrupt) {
    stop_ = ::eventfd(0, EFD_CLOEXEC);
    if (stop_ < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
    thread_ = std::thread([this, sigfd, interrupt = std::move(interrupt)] {
      pollfd fds[2] = {{sigfd, POLLIN, 0}, {stop_, POLLIN, 0}};
      while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
      }
      if (fds[0].revents != 0 && fds[1].revents == 0) {
        fired_ = true;
        interrupt();
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

}  // namespace

bool signal_pending(int sigfd) {
  pollfd p{sigfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && p.revents != 0;
}

int read_signal(int sigfd) {
  signalfd_siginfo si{};
  if (::read(sigfd, &si, sizeof(si)) != static_cast<ssize_t>(sizeof(si))) return 0;
  return static_cast<int>(si.ssi_signo);
}

Formed StoreRendezvous::form(const NodeDesc& self, int hint, int expect) {
  previous_worker_store_ = std::move(worker_store_);  // the last round's (regrouping)
  host_ = self.host;
  Formed out;
  // Alone on a private store (--standalone, one node), nothing can block: no watcher
  // threads, and the workers share the agent's store.
  std::optional<SignalInterrupt> on_signal;
  if (!s_.solo) on_signal.emplace(s_.sigfd, s_.interrupt);
  Rendezvous& rdzv = s_.rendezvous;
  try {
    out.round = rdzv.next_round(self, hint, expect, [&](int r) {
      if (s_.liveness) s_.liveness->set_will(rdzv.event_key(r), s_.lost_will);
    });
    if (out.round.group_rank == 0) {
      if (s_.agent_store_serves) {
        // Every node stopped its workers before it joined this round, and none starts new
        // ones before the master is published: nothing can write while the keys go.
        clear_worker_keys(*s_.client);
        out.master_port = s_.store_port;
        if (s_.store_server && !s_.solo) s_.store_server->set_trusted(workers_networks(out.round));
      } else {
        worker_store_ =
            start_server(s_.workers_bind, 0, s_.access, workers_networks(out.round), true);
        out.master_port = worker_store_->port();
      }
      out.master_addr = s_.workers_addr;
      if (!s_.solo) rdzv.publish_master(out.round, out.master_addr, out.master_port);
    } else {
      std::tie(out.master_addr, out.master_port) = rdzv.master(out.round);
    }
  } catch (const TimeoutError& e) {
    out.kind = Formation::timed_out;
    out.message = e.what();
    return out;
  } catch (const SpareNotNeeded&) {
    out.kind = Formation::spare_not_needed;
    return out;
  } catch (const IoError&) {
    // The interrupted call may fail before the watching thread has marked the signal.
    if (!on_signal || !(on_signal->fired() || signal_pending(s_.sigfd))) throw;
  }
  if (on_signal && on_signal->fired()) out.signal = read_signal(s_.sigfd);
  return out;
}

// Loopback, this host, the round's members (their published addresses) and --store-allow; a
// member none of whose addresses is known is named once: its workers would be refused.
std::vector<rdzv::Cidr> StoreRendezvous::workers_networks(const Round& round) {
  std::vector<std::string> unresolved;
  auto nets = round_networks(s_.rendezvous.members(round), s_.access.allow, &unresolved);
  for (const auto& node : unresolved) {
    std::fprintf(stderr,
                 "ddprun: no address of node %s is known: the workers' store will refuse its "
                 "workers; give it --local-addr, or admit its network with --store-allow\n",
                 node.c_str());
  }
  return nets;
}

void StoreRendezvous::finished(const Round& round) {
  s_.rendezvous.finished(round, host_, round.group_rank);
}

RoundEvent StoreRendezvous::end_round(const Round& round, const RoundEvent& event, bool reopen) {
  return s_.rendezvous.end_round(round, event, reopen);
}

// Leaving the job for good: the store's host stays until the others have left (bounded), so
// none of them loses the store in the middle of its last request.
void StoreRendezvous::depart(const Round& round) {
  try {
    s_.rendezvous.leave(round);
    if (s_.hosts_store) s_.rendezvous.wait_all_left(round, std::chrono::milliseconds(10000));
  } catch (const Error&) {
    // the store is gone already: nobody left to wait for
  }
}

std::string LocalRound::make_attempt(int restart_count) {
  return s_.logs.make_attempt(restart_count);
}

void LocalRound::open(const Round& round) {
  round_ = round;
  if (!s_.solo) {
    watcher_ = s_.make_watcher(s_.rendezvous.event_key(round));
  }
}

// In-place recovery: the replacement starts alone; check_heals() says when it stepped. The
// node's other workers hear of the death on their control pipes (peer_lost, regroup.hpp).
std::string LocalRound::respawn(int local_rank, int heal) {
  if (!workers_ || !pump_) return "no round is running";
  SpawnPlan plan{s_.config, group_, s_.agent_env, s_.prefix_template, s_.host, s_.nproc};
  plan.progress = progress_.get();
  const auto died = std::chrono::system_clock::now();
  // The node's other workers first (best effort: a full or closed pipe is skipped): a
  // collective that cannot see the death (NCCL between this node's GPUs) stops on it.
  if (progress_) {
    const std::string line = format_peer_lost({group_.base_global_rank + local_rank, heal});
    for (int r = 0; r < s_.nproc; ++r) {
      if (r != local_rank) progress_->tell(r, line);
    }
  }
  std::string err = respawn_worker(plan, local_rank, heal, *pump_, *workers_);
  if (err.empty()) {  // a replacement that died before its first step: only the new one counts
    std::erase_if(heals_, [&](const Heal& h) { return h.local_rank == local_rank; });
    heals_.push_back({local_rank, heal, died});
  }
  return err;
}

// A replacement's first step (on its own clock) ends its heal: said once, and to the status.
void LocalRound::check_heals() {
  if (!progress_) return;
  for (auto it = heals_.begin(); it != heals_.end();) {
    const auto r = progress_->ranks().find(it->local_rank);
    const double died = std::chrono::duration<double>(it->died.time_since_epoch()).count();
    // A replacement: its first step; a regrouped worker: its first step after its heal.
    double stepped = -1;
    if (r != progress_->ranks().end()) {
      stepped = it->regroup ? (r->second.healed_unix > died ? r->second.healed_unix : -1)
                            : r->second.first_step_unix;
    }
    if (stepped < 0) {
      ++it;
      continue;
    }
    const double took = std::max(0.0, stepped - died);
    char what[160];
    if (it->regroup) {
      std::snprintf(what, sizeof what, "rank %d (local_rank %d) regrouped in %.2f s",
                    group_.base_global_rank + it->local_rank, it->local_rank, took);
    } else {
      std::snprintf(what, sizeof what, "rank %d (local_rank %d), heal %d, healed in %.2f s",
                    group_.base_global_rank + it->local_rank, it->local_rank, it->heal, took);
    }
    std::fprintf(stderr, "ddprun: %s\n", what);
    if (s_.status) s_.status->healed(took, what);
    it = heals_.erase(it);
  }
}

bool LocalRound::can_regroup() {
  if (!workers_ || !progress_ || workers_->running() != static_cast<std::size_t>(s_.nproc)) {
    return false;
  }
  // Their declarations may still wait in the pipes (drained at each check, not at each line).
  const auto now = std::chrono::steady_clock::now();
  for (int fd : progress_->fds()) progress_->on_readable(fd, now);
  for (int r = 0; r < s_.nproc; ++r) {
    const auto it = progress_->ranks().find(r);
    if (it == progress_->ranks().end() || !it->second.regroups) return false;
  }
  return true;
}

// Regrouping: each running worker is told its place in the new group; nothing is spawned.
SpawnResult LocalRound::regroup(const GroupInfo& group,
                                std::chrono::system_clock::time_point since) {
  SpawnResult result;
  group_ = group;
  heals_.clear();
  for (int r = 0; r < s_.nproc; ++r) {
    Regroup line;
    line.round = round_.number;
    line.rank = group.base_global_rank + r;
    line.world = group.world_size;
    line.local_rank = r;
    line.local_world = group.local_world_size;
    line.group_rank = group.group_rank;
    line.group_world = group.group_world_size;
    line.master_addr = group.master_addr;
    line.master_port = group.master_port;
    line.joining = group.joining_ranks;
    if (!progress_->tell(r, format_regroup(line))) {
      result.error = "cannot tell local rank " + std::to_string(r) +
                     " its place in the regrouped job (its control pipe is closed or full)";
      result.rank = r;
      return result;
    }
    heals_.push_back({r, 0, since, true});
  }
  monitor_.reset();
  start_monitor(group);
  tell_started(group);
  return result;
}

SpawnResult LocalRound::start(const GroupInfo& group) {
  group_ = group;
  heals_.clear();
  pump_ = std::make_unique<OutputPump>();
  // A SIGUSR1/2 that came while no worker ran (rendezvous, restart) is dropped: delivered now
  // it would reach the new workers before they can handle it, and kill them.
  while (int sig = read_signal(s_.passfd)) {
    std::fprintf(stderr, "ddprun: signal %d (%s) came while no worker ran; dropped\n", sig,
                 strsignal(sig));
  }
  workers_ = std::make_unique<WorkerGroup>(
      WorkerGroup::Options{s_.process.inherited_fds, s_.process.nofile_soft});
  if (s_.hang.enabled() || s_.timer || s_.status) progress_ = std::make_unique<ProgressReader>();
  SpawnPlan plan{s_.config, group, s_.agent_env, s_.prefix_template, s_.host, s_.nproc};
  plan.progress = progress_.get();
  SpawnResult result = spawn_workers(plan, *pump_, *workers_, s_.sigfd);
  if (progress_ && result.error.empty() && !result.stop_signal) start_monitor(group);
  if (result.error.empty()) tell_started(group);
  return result;
}

void LocalRound::tell_started(const GroupInfo& group) {
  if (!s_.status) return;
  std::vector<RankStart> ranks;
  const auto pids = workers_->pids();  // in local rank order
  for (std::size_t i = 0; i < pids.size(); ++i) {
    const int r = static_cast<int>(i);
    const int gpu = i < s_.gpus.size() ? s_.gpus[i] : -1;
    ranks.push_back({r, group.base_global_rank + r, pids[i], gpu});
  }
  s_.status->workers_started(ranks);
}

// What the live status learns from one turn: exits, a named hang, progress (4 times a second).
void LocalRound::tell_status(const std::vector<WorkerExit>& exits, const Observation& o) {
  for (const WorkerExit& e : exits) {
    s_.status->worker_exited(e.local_rank, e.signal ? -e.signal : e.exit_code,
                             e.failed() ? e.in_words() : "", e.failed());
  }
  if (o.hang && o.hang->local_rank >= 0) s_.status->hung(o.hang->local_rank);
  const auto now = std::chrono::steady_clock::now();
  if (progress_ && (now >= next_status_ || !exits.empty())) {
    // A worker's last lines are in its pipe when it exits: read them first.
    if (!exits.empty()) {
      for (int fd : progress_->fds()) progress_->on_readable(fd, now);
    }
    s_.status->progress(progress_->ranks());
    next_status_ = now + std::chrono::milliseconds(250);
  }
}

void LocalRound::start_monitor(const GroupInfo& group) {
  std::unique_ptr<HealthBus> bus =
      s_.health_store && !s_.solo
          ? store_health_bus(*s_.health_store, s_.rendezvous.event_key(round_) + "/health",
                             round_.group_rank, round_.group_world_size)
          : local_health_bus();
  HangMonitor::Setup ms;
  ms.settings = s_.hang;
  ms.host = s_.host;
  ms.group_rank = round_.group_rank;
  ms.group_world_size = s_.health_store && !s_.solo ? round_.group_world_size : 1;
  ms.report_dir = group.attempt_dir;
  auto path = s_.agent_env.find("PATH");
  ms.path_var = path == s_.agent_env.end() ? "" : path->second;
  ms.timer = s_.timer;
  monitor_ = std::make_unique<HangMonitor>(ms, std::move(bus), *progress_);
  std::vector<MonitorWorker> watched;
  const auto pids = workers_->pids();  // in local rank order (spawn_workers' order)
  for (std::size_t i = 0; i < pids.size(); ++i) {
    const int r = static_cast<int>(i);
    watched.push_back({r, group.base_global_rank + r, pids[i]});
  }
  monitor_->started(watched, std::chrono::steady_clock::now());
}

void LocalRound::stop(int sig) {
  stop_round(*workers_, s_.grace, sig, s_.process.watcher);
  pump_->drain();
}

void LocalRound::finish() {
  pump_->drain();
  clear_leftovers(s_.process.watcher);
}

void LocalRound::remove_temporary_logs() {
  s_.logs.remove_if_temporary();
  if (s_.logs.kept()) {
    std::fprintf(stderr, "ddprun: the workers' redirected output is in %s\n",
                 s_.logs.root().c_str());
  }
}

// One poll turn over everything at once, in the order the facts rank: output first, orphans,
// signals to pass on, then a stop signal ends the turn; failed exits; all done; the event.
Observation LocalRound::wait() {
  Observation o;
  constexpr std::size_t kFixed = 4;  // sigfd, watcher, passfd, chldfd; then pidfds, outputs
  std::vector<pollfd> fds{{s_.sigfd, POLLIN, 0},
                          {watcher_ ? watcher_->fd() : -1, POLLIN, 0},
                          {s_.passfd, POLLIN, 0},
                          {s_.chldfd, POLLIN, 0}};
  const auto pidfds = workers_->live_pidfds();
  for (int fd : pidfds) fds.push_back({fd, POLLIN, 0});
  const auto outs = pump_->fds();
  for (int fd : outs) fds.push_back({fd, POLLIN, 0});
  const std::size_t mon_at = fds.size();
  const auto mon = monitor_ ? monitor_->fds() : std::vector<int>{};
  for (int fd : mon) fds.push_back({fd, POLLIN, 0});
  const int timeout = monitor_ ? monitor_->timeout_ms(std::chrono::steady_clock::now()) : -1;
  if (::poll(fds.data(), fds.size(), timeout) < 0) {
    if (errno == EINTR) return o;
    throw IoError(std::string("poll failed: ") + std::strerror(errno));
  }
  for (std::size_t i = kFixed + pidfds.size(); i < mon_at; ++i) {
    if (fds[i].revents != 0) pump_->on_readable(fds[i].fd);
  }
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = mon_at; i < fds.size(); ++i) {
    if (fds[i].revents != 0) monitor_->on_readable(fds[i].fd, now);
  }
  if (fds[3].revents != 0) {
    while (read_signal(s_.chldfd) != 0) {
    }
    reap_orphans(workers_->pids());  // never a worker: WorkerGroup reaps those
  }
  if (fds[2].revents != 0) {
    if (int sig = read_signal(s_.passfd); sig != 0) {
      std::fprintf(stderr, "ddprun: received signal %d (%s), passing it on to the workers\n", sig,
                   strsignal(sig));
      workers_->signal_all(sig);
    }
  }
  if (fds[0].revents != 0) {
    if (int sig = read_signal(s_.sigfd); sig != 0) {
      o.stop_signal = sig;
      return o;
    }
  }
  std::vector<WorkerExit> exits;
  bool drained = false;  // a failed worker's last lines (its declaration too) are read first
  for (std::size_t i = 0; i < pidfds.size(); ++i) {
    if (fds[kFixed + i].revents == 0) continue;
    WorkerExit e = workers_->reap_pidfd(pidfds[i]);
    if (e.failed() && progress_) {
      if (!drained) {
        for (int fd : progress_->fds()) progress_->on_readable(fd, now);
        drained = true;
      }
      const auto it = progress_->ranks().find(e.local_rank);
      e.recovers_in_place = it != progress_->ranks().end() && it->second.recovers_in_place;
    }
    if (e.failed()) o.failed.push_back(e);
    if (s_.status) exits.push_back(e);
  }
  check_heals();
  if (!o.failed.empty()) {
    if (s_.status) tell_status(exits, o);
    return o;
  }
  if (monitor_) {
    if (auto a = monitor_->check(now)) {
      HangReport h;
      h.local_rank = a->local_rank;
      h.rank = a->rank;
      h.silent = std::chrono::milliseconds(static_cast<long>(a->silent_s * 1000));
      h.stop_job = a->stop_job;
      h.what = a->what;
      o.hang = h;
    }
  }
  if (s_.status) tell_status(exits, o);
  check_heals();
  o.all_done = workers_->running() == 0;
  if (watcher_ && fds[1].revents != 0) {
    if (auto ev = watcher_->event()) {
      o.event = *ev;
    } else {
      o.store_lost = true;
      o.store_error = watcher_->error();
    }
  }
  return o;
}

}  // namespace ddp::launch
