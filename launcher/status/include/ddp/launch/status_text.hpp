// What the agent prints about its job on a terminal: the live progress line of the local
// workers (step, samples/s, ETA) and, at exit, the summary table (wall time, restarts and why,
// each rank's exit, the slowest rank). Pure: strings from status records.
#pragma once

#include <string>
#include <vector>

#include "ddp/status/record.hpp"

namespace ddp::launch {

// A duration as people read it: "42s", "3m04s", "1h02m" (seconds rounded; negative: "0s").
std::string format_duration(double seconds);

// One line, no newline: "ddprun: step 120/1000 | 3450 samples/s | step 0.21 s | ETA 3m04s".
// The step is the slowest local rank's; total, samples/s (summed over the local ranks), the
// median step time and the ETA ((total - step) * step time) appear when known.
// "" when no local rank reported progress yet.
std::string format_progress_line(const status::NodeStatus& node);

// The exit summary (several lines, each ending in '\n'): wall time, final state and exit code,
// restarts and their causes, each rank's last state and exit, the slowest rank. `job` is what
// the store said at the end (may hold only this node).
std::string format_exit_summary(const status::JobStatus& job, double wall_s, int exit_code);

}  // namespace ddp::launch
