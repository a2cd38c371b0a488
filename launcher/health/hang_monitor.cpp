// The per-node hang and straggler watch (see hang_monitor.hpp): checks every
// check_interval(), each costing one SET and one trigger read on the health bus (the leader adds
// one MULTI_GET), a few /proc reads per worker, and nothing per training step.
#include "ddp/launch/hang_monitor.hpp"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "ddp/launch/agent_error_file.hpp"
#include "ddp/launch/proc_sample.hpp"
#include "ddp/launch/stack_merge.hpp"
#include "ddp/launch/stacks.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

using std::chrono::duration;
using std::chrono::milliseconds;

double seconds(SteadyTime::duration d) { return duration<double>(d).count(); }

// A rank without a progress channel counts as working while it takes this share of a core.
constexpr double kBusyCpu = 0.05;

double unix_now() {
  return duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The parent of `pid` from /proc/<pid>/stat (0 when gone).
pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 1));
  char state = 0;
  long ppid = 0;
  rest >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) std::fprintf(stderr, "ddprun: cannot write %s\n", path.c_str());
}

const char* sig_name(int sig) {
  const char* n = ::sigabbrev_np(sig);
  return n ? n : "?";
}

}  // namespace

milliseconds check_interval(const HangSettings& s) {
  if (s.timeout_s <= 0) return milliseconds(1000);
  const auto eighth = milliseconds(static_cast<long>(s.timeout_s * 1000 / 8));
  return std::clamp(eighth, milliseconds(100), milliseconds(1000));
}

HangMonitor::HangMonitor(Setup setup, std::unique_ptr<HealthBus> bus, ProgressReader& progress)
    : s_(std::move(setup)),
      bus_(std::move(bus)),
      progress_(progress),
      interval_(check_interval(s_.settings)) {}

void HangMonitor::started(const std::vector<MonitorWorker>& workers, SteadyTime now) {
  watched_.clear();
  for (const auto& w : workers) {
    Watched x;
    x.w = w;
    x.cpu_moved = now;
    if (auto p = sample_process(w.pid)) x.cpu_ticks = p->cpu_ticks;
    watched_.push_back(x);
  }
  last_check_ = now;
  next_check_ = now + interval_;
}

// Only torch's timer FIFO is polled: its requests are few, and a release must be read before
// its timer expires. The progress pipes are drained at each check instead.
std::vector<int> HangMonitor::fds() const {
  std::vector<int> out;
  if (s_.timer) out.push_back(s_.timer->fd());
  return out;
}

bool HangMonitor::is_ours(pid_t pid) const {
  for (int hops = 0; pid > 1 && hops < 64; ++hops) {
    for (const auto& x : watched_) {
      if (x.w.pid == pid) return true;
    }
    pid = parent_of(pid);
  }
  return false;
}

void HangMonitor::on_readable(int fd, SteadyTime now) {
  if (s_.timer && fd == s_.timer->fd()) {
    for (const TimerRequest& r : s_.timer->on_readable()) {
      // An acquire or a release is progress of the worker that made it.
      for (pid_t p = r.pid, hops = 0; p > 1 && hops < 64; p = parent_of(p), ++hops) {
        auto it = std::find_if(watched_.begin(), watched_.end(),
                               [&](const Watched& x) { return x.w.pid == p; });
        if (it != watched_.end()) {
          progress_.note_activity(it->w.local_rank, now);
          break;
        }
      }
    }
    return;
  }
  progress_.on_readable(fd, now);
}

int HangMonitor::timeout_ms(SteadyTime now) const {
  long ms =
      std::max<long>(0, std::chrono::duration_cast<milliseconds>(next_check_ - now).count() + 1);
  if (s_.timer) {
    const int t = s_.timer->timeout_ms(unix_now());
    if (t >= 0) ms = std::min<long>(ms, t);
  }
  return static_cast<int>(ms);
}

// torch's expiry: the signal goes to the pid that asked for the timer (only one of ours).
void HangMonitor::expire_timers() {
  if (!s_.timer) return;
  s_.timer->forget_dead_pids();  // as torch's watchdog does on every pass
  for (const TimerRequest& r : s_.timer->take_expired(unix_now())) {
    if (!is_ours(r.pid)) {
      std::fprintf(stderr,
                   "ddprun: torch file timer '%s' of pid %d expired, but that pid is no worker of "
                   "this agent (nor below one); not signalled\n",
                   r.scope_id.c_str(), static_cast<int>(r.pid));
      continue;
    }
    int local_rank = -1, rank = -1;
    for (pid_t p = r.pid, hops = 0; p > 1 && hops < 64 && local_rank < 0;
         p = parent_of(p), ++hops) {
      for (const auto& x : watched_) {
        if (x.w.pid == p) local_rank = x.w.local_rank, rank = x.w.rank;
      }
    }
    timer_scope_ = r.scope_id;
    std::fprintf(stderr,
                 "ddprun: torch file timer expired: scope '%s' of rank %d (local rank %d, pid %d "
                 "on %s); reaping it with signal %d (SIG%s)\n",
                 r.scope_id.c_str(), rank, local_rank, static_cast<int>(r.pid), s_.host.c_str(),
                 r.signal, sig_name(r.signal));
    if (r.signal > 0) ::kill(r.pid, r.signal);
    s_.timer->forget_pid(r.pid);
  }
}

NodeSummary HangMonitor::summarize(SteadyTime now) {
  NodeSummary sum;
  sum.group_rank = s_.group_rank;
  sum.host = s_.host;
  sum.seq = ++seq_;
  const double elapsed = std::max(1e-3, seconds(now - last_check_));
  const double hz = static_cast<double>(clock_ticks_per_second());
  for (auto& x : watched_) {
    if (x.gone) continue;
    auto p = sample_process(x.w.pid);
    if (!p || p->state == 'Z') {
      x.gone = true;  // exited: its exit is the loop's business
      continue;
    }
    const std::uint64_t delta = p->cpu_ticks >= x.cpu_ticks ? p->cpu_ticks - x.cpu_ticks : 0;
    x.cpu_ticks = p->cpu_ticks;
    x.cpu_frac = static_cast<double>(delta) / hz / elapsed;
    // Busy, not just awake: a waiting rank's helper threads (gloo's event loop) take a tick now
    // and then; a rank that computes takes most of a core.
    if (x.cpu_frac >= kBusyCpu || p->state == 'R') x.cpu_moved = now;
    x.state = p->state;
    RankHealth h;
    h.rank = x.w.rank;
    h.local_rank = x.w.local_rank;
    h.pid = x.w.pid;
    h.cpu_frac = x.cpu_frac;
    h.state = x.state;
    double since_progress = seconds(now - x.cpu_moved);
    if (auto it = progress_.ranks().find(x.w.local_rank); it != progress_.ranks().end()) {
      const RankProgress& rp = it->second;
      h.step = rp.step;
      h.phase = rp.phase;
      h.reports = rp.reported;
      since_progress = seconds(now - rp.last_change);
      h.median_step_s = median(rp.step_s);
      h.steps_known = static_cast<int>(rp.step_s.size());
    }
    h.idle_s = rank_idle_s(h.reports, since_progress, seconds(now - x.cpu_moved));
    sum.ranks.push_back(h);
  }
  last_check_ = now;
  return sum;
}

void HangMonitor::answer_trigger(std::uint64_t epoch) {
  std::vector<pid_t> pids;
  for (const auto& x : watched_) {
    if (!x.gone) pids.push_back(x.w.pid);
  }
  const auto stacks = take_stacks(pids, s_.path_var, milliseconds(2000));
  std::vector<RankStack> ranks;
  for (const auto& x : watched_) {
    if (x.gone) continue;
    RankStack r;
    r.rank = x.w.rank;
    r.local_rank = x.w.local_rank;
    r.node = s_.host;
    r.pid = x.w.pid;
    if (auto it = progress_.ranks().find(x.w.local_rank); it != progress_.ranks().end()) {
      r.step = it->second.step;
      r.phase = it->second.phase;
    }
    for (const auto& p : stacks) {
      if (p.pid == x.w.pid) r.stacks = p;
    }
    ranks.push_back(std::move(r));
  }
  bus_->publish_stacks(epoch, rank_stacks_to_json(ranks));
  answered_ = epoch;
}

std::optional<HangAction> HangMonitor::check(SteadyTime now) {
  expire_timers();
  if (now < next_check_) return std::nullopt;
  next_check_ = now + interval_;
  // Progress is drained even with detection off: the live status shows it (status_reporter).
  for (int fd : progress_.fds()) progress_.on_readable(fd, now);
  if (broken_ || !s_.settings.enabled()) return std::nullopt;
  try {
    bus_->publish(summarize(now));
    const std::uint64_t epoch = bus_->triggered();
    if (epoch > answered_) answer_trigger(epoch);
    paused_ = false;
    if (bus_->leader()) return lead(now);
  } catch (const IoError&) {
    // The store is away (the agent rides the outage out, and says so): skip this check only.
    paused_ = true;
  } catch (const TimeoutError&) {
    // A peer's summary is not there yet (the store came back empty, or the peer is slow).
    paused_ = true;
  } catch (const Error& e) {
    broken_ = true;
    std::fprintf(stderr, "ddprun: hang detection stops for this round: %s\n", e.what());
  }
  return std::nullopt;
}

std::optional<HangAction> HangMonitor::lead(SteadyTime now) {
  if (epoch_ > 0 && epoch_ > reported_) {
    const auto arrived = bus_->collect_stacks(epoch_);
    const bool complete = static_cast<int>(arrived.size()) >= s_.group_world_size;
    if (complete || now - trigger_time_ > std::chrono::seconds(10)) {
      return finish_report(arrived, complete);
    }
    return std::nullopt;
  }
  const auto nodes = bus_->collect();
  const JobVerdict v = judge(nodes, s_.settings, stragglers_);
  for (const auto& n : nodes) {
    for (const auto& h : n.ranks) {
      if (std::find(v.stragglers.begin(), v.stragglers.end(), h.rank) == v.stragglers.end()) {
        continue;
      }
      StragglerFinding f{h.rank,          h.local_rank,           n.host,
                         h.median_step_s, v.straggler_baseline_s, h.steps_known};
      std::fputs((format_straggler(f) + "\n").c_str(), stderr);
      straggler_findings_.push_back(f);
    }
  }
  if (!v.stragglers.empty() && !s_.report_dir.empty()) {
    write_file(s_.report_dir + "/stragglers.json", stragglers_json(straggler_findings_));
  }
  if (!v.hung()) {
    armed_ = true;  // progress again: a later hang is a new one
    return std::nullopt;
  }
  if (!armed_ || s_.settings.timeout_s <= 0) return std::nullopt;
  armed_ = false;
  // Ranks whose own progress channel went silent: when only some did, they are the suspects
  // (merge_stacks puts them first). Idleness seen in /proc alone says less: a rank waiting in
  // a collective goes idle as soon as the one it waits for, or sooner.
  stalled_.clear();
  trigger_silent_s_ = 0;
  for (const auto& n : nodes) {
    for (const auto& h : n.ranks) {
      trigger_silent_s_ = std::max(trigger_silent_s_, h.idle_s);
      if (h.reports && std::find(v.stalled.begin(), v.stalled.end(), h.rank) != v.stalled.end()) {
        stalled_.push_back(h.rank);
      }
    }
  }
  epoch_ = std::max(epoch_, answered_) + 1;
  trigger_time_ = now;
  bus_->trigger(epoch_);
  answer_trigger(epoch_);  // this node's stacks at once
  if (s_.group_world_size == 1) return finish_report(bus_->collect_stacks(epoch_), true);
  return std::nullopt;
}

std::optional<HangAction> HangMonitor::finish_report(
    const std::vector<std::pair<int, std::string>>& arrived, bool complete) {
  reported_ = epoch_;
  HangFinding f;
  f.kind = "hang";
  f.waited_s = trigger_silent_s_;
  f.timeout_s = s_.settings.timeout_s;
  f.action = to_string(s_.settings.action);
  for (const auto& [group_rank, json] : arrived) {
    try {
      for (auto& r : rank_stacks_from_json(json)) f.ranks.push_back(std::move(r));
    } catch (const Error& e) {
      f.not_taken.push_back("node " + std::to_string(group_rank) + ": " + e.what());
    }
  }
  if (!complete) {
    f.not_taken.push_back(std::to_string(s_.group_world_size - static_cast<int>(arrived.size())) +
                          " node(s) sent no stacks within 10 s");
  }
  for (const auto& r : f.ranks) {
    if (!r.stacks.error.empty()) {
      f.not_taken.push_back("rank " + std::to_string(r.rank) + " (node " + r.node + ", pid " +
                            std::to_string(r.pid) + "): " + r.stacks.error);
    }
  }
  std::sort(f.ranks.begin(), f.ranks.end(),
            [](const RankStack& a, const RankStack& b) { return a.rank < b.rank; });
  for (auto& r : f.ranks) {
    r.stalled = std::find(stalled_.begin(), stalled_.end(), r.rank) != stalled_.end();
  }
  f.groups = merge_stacks(f.ranks);
  std::fputs(format_hang(f).c_str(), stderr);
  error_message_ = hang_error_message(f);
  note_agent_error(error_message_);  // the error file's root cause, unless a failure follows
  if (!s_.report_dir.empty()) {
    write_file(s_.report_dir + "/hang_report.json", hang_json(f));
    if (s_.settings.action == OnHang::dump) {
      for (const auto& r : f.ranks) {
        write_file(s_.report_dir + "/stacks_rank_" + std::to_string(r.rank) + ".json",
                   rank_stacks_to_json({r}));
      }
    }
  }
  if (s_.settings.action != OnHang::restart && s_.settings.action != OnHang::stop) {
    return std::nullopt;
  }
  HangAction a;
  a.stop_job = s_.settings.action == OnHang::stop;
  a.silent_s = f.waited_s;
  const RankStack* suspect = nullptr;
  if (!f.groups.empty() && !f.groups.front().ranks.empty()) {
    for (const auto& r : f.ranks) {
      if (r.rank == f.groups.front().ranks.front()) suspect = &r;
    }
  }
  if (suspect) {
    a.rank = suspect->rank;
    if (suspect->node == s_.host) a.local_rank = suspect->local_rank;
    a.what = "rank " + std::to_string(suspect->rank) + " (node " + suspect->node + ", local rank " +
             std::to_string(suspect->local_rank) + ", pid " + std::to_string(suspect->pid) +
             ") stopped making progress";
  } else {
    a.what = "the job stopped making progress";
  }
  return a;
}

}  // namespace ddp::launch
