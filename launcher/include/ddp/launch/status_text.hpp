// What the agent prints about its job on a terminal: the live progress line of the local
// workers (step, samples/s, ETA) and, at exit, the summary table (wall time, restarts and why,
// each rank's exit, the slowest rank). Pure: strings from status records.
#pragma once

#include <string>
#include <vector>

#include "ddp/status/record.hpp"

namespace ddp::launch {

// One line, no newline: "ddprun: step 120/1000 | 3450 samples/s | step 0.21 s | ETA 3m04s".
// "" when no local rank reported progress yet.
std::string format_progress_line(const status::NodeStatus& node);

// The exit summary: `job` is what the store said at the end (may hold only this node).
std::string format_exit_summary(const status::JobStatus& job, double wall_s, int exit_code);

}  // namespace ddp::launch
