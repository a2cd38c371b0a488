// When is a job hung, and who is slow: pure verdicts over the nodes' health summaries.
// A rank is stalled when it has made no progress for --hang-timeout: by its progress channel
// when it has one (ddp-train, DDPRUN_PROGRESS_FD, torch's file timer), else by /proc (no CPU
// time and not running for that long). The job is hung when any rank is stalled; the stacks
// then say which rank is the cause. A straggler is a rank whose median step time is above
// --straggler-factor times the job's median for `straggler_checks` checks in a row.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

enum class OnHang { report, dump, restart, stop };
OnHang parse_on_hang(const std::string& text);  // throws ddp::ConfigError naming --on-hang
const char* to_string(OnHang a);

struct HangSettings {
  double timeout_s = 0;  // 0: hang detection off
  OnHang action = OnHang::report;
  double straggler_factor = 0;  // 0: off
  int straggler_checks = 3;     // consecutive checks above the factor
  int straggler_min_steps = 4;  // step durations a rank needs before it is compared
  bool enabled() const { return timeout_s > 0 || straggler_factor > 0; }
};

// One rank as its node sees it at one check.
struct RankHealth {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  std::int64_t step = -1;
  std::string phase;
  bool reports = false;  // has a progress channel that spoke
  double idle_s = 0;     // seconds without progress (or, without a channel, without CPU)
  double cpu_frac = 0;   // share of one CPU over the last check
  char state = '?';
  double median_step_s = 0;  // 0: not enough steps
  int steps_known = 0;
};

struct NodeSummary {
  int group_rank = 0;
  std::string host;
  std::uint64_t seq = 0;  // increases with every summary the node publishes
  std::vector<RankHealth> ranks;
};

std::string encode_summary(const NodeSummary& s);     // compact JSON, well under 1 KiB/rank
NodeSummary decode_summary(const std::string& text);  // throws ddp::ProtocolError

// The idle time of one rank from what the node saw (pure; the node keeps `cpu_idle_since`).
double rank_idle_s(bool reports, double since_progress_s, double since_cpu_moved_s);

struct JobVerdict {
  std::vector<int> stalled;         // ranks idle for the timeout, sorted
  std::vector<int> stragglers;      // ranks named as stragglers by this check (each once)
  double straggler_baseline_s = 0;  // the job's median step time they were compared with
  bool hung() const { return !stalled.empty(); }
};

// The consecutive-check counts that straggler detection needs between checks.
struct StragglerState {
  std::map<int, int> above;   // rank -> consecutive checks above the factor
  std::map<int, bool> named;  // rank -> already named this round
};

JobVerdict judge(const std::vector<NodeSummary>& nodes, const HangSettings& s, StragglerState& st);

}  // namespace ddp::launch
