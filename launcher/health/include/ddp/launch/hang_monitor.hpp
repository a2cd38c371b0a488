// The per-node hang and straggler watch of one round, run inside the agent's event loop
// (LocalRound::wait): reads the workers' progress pipes and torch's file timer, samples /proc at
// each check, publishes this node's summary on the health bus, and on the leader (group rank 0)
// judges the job: a hang makes every node take its workers' stacks, the leader merges them
// (STAT's way), prints and writes the report, and hands the action back to the loop
// (restart / stop); stragglers are named once each. See docs/hangs.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/launch/file_timer.hpp"
#include "ddp/launch/hang_policy.hpp"
#include "ddp/launch/hang_report.hpp"
#include "ddp/launch/health.hpp"
#include "ddp/launch/progress.hpp"

namespace ddp::launch {

struct MonitorWorker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = 0;
};

// What the loop must do about a hang (report and dump need nothing from it).
struct HangAction {
  int local_rank = -1;  // a suspect on this node, else -1
  int rank = -1;        // the first suspect's global rank
  bool stop_job = false;
  std::string what;  // one line: "rank 1 (node a, local rank 1) stopped making progress"
  double silent_s = 0;
};

// The check interval for a timeout: an eighth of it, within [100 ms, 1 s].
std::chrono::milliseconds check_interval(const HangSettings& s);

class HangMonitor {
 public:
  struct Setup {
    HangSettings settings;
    std::string host;
    int group_rank = 0;
    int group_world_size = 1;
    std::string report_dir;  // the attempt's log folder: hang_report.json, stragglers.json
    std::string path_var;    // PATH to find py-spy and eu-stack on
    FileTimerServer* timer = nullptr;  // torch's file timer, when enabled (the agent's)
  };
  HangMonitor(Setup setup, std::unique_ptr<HealthBus> bus, ProgressReader& progress);

  void started(const std::vector<MonitorWorker>& workers, SteadyTime now);
  std::vector<int> fds() const;  // progress pipes and the timer's FIFO
  void on_readable(int fd, SteadyTime now);
  int timeout_ms(SteadyTime now) const;  // until the next check or timer expiry (-1: none)
  // Runs what is due; a hang the loop must act on (restart or stop), after its report.
  std::optional<HangAction> check(SteadyTime now);
  // The report's one paragraph, for the error file, once a hang was found ("" before).
  const std::string& error_message() const { return error_message_; }

 private:
  struct Watched {
    MonitorWorker w;
    std::uint64_t cpu_ticks = 0;
    SteadyTime cpu_moved{};
    double cpu_frac = 0;
    char state = '?';
    bool gone = false;
  };
  NodeSummary summarize(SteadyTime now);
  void expire_timers();
  void answer_trigger(std::uint64_t epoch);
  std::optional<HangAction> lead(SteadyTime now);
  std::optional<HangAction> finish_report(const std::vector<std::pair<int, std::string>>& arrived,
                                          bool complete);
  bool is_ours(pid_t pid) const;

  Setup s_;
  std::unique_ptr<HealthBus> bus_;
  ProgressReader& progress_;
  std::vector<Watched> watched_;
  std::chrono::milliseconds interval_;
  SteadyTime next_check_{};
  SteadyTime last_check_{};
  std::uint64_t seq_ = 0;
  std::uint64_t answered_ = 0;  // the last epoch whose stacks this node published
  std::uint64_t epoch_ = 0;     // leader: the last epoch triggered
  std::uint64_t reported_ = 0;  // leader: the last epoch reported
  bool armed_ = true;           // leader: a new hang may be reported (re-armed by progress)
  SteadyTime trigger_time_{};
  double trigger_silent_s_ = 0;
  std::vector<int> stalled_;
  StragglerState stragglers_;
  std::vector<StragglerFinding> straggler_findings_;
  std::string timer_scope_;  // a timer that expired: the report names its scope
  std::string error_message_;
  bool broken_ = false;  // the bus failed for good: watch locally only
  bool paused_ = false;  // the store is away: the checks resume when it is back
};

}  // namespace ddp::launch
