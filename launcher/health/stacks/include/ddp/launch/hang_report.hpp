// The report of a hang or a straggler: on the console (the suspect group first, with node,
// local rank, pid and stack), as JSON in the log folder (hang_report.json, stragglers.json),
// and as the error file's message. Pure formatting.
#pragma once

#include <string>
#include <vector>

#include "ddp/launch/stack_merge.hpp"

namespace ddp::launch {

struct HangFinding {
  std::string kind;     // "hang" (no progress), "timer" (a torch file timer expired)
  double waited_s = 0;  // how long without progress
  std::string action;   // report | dump | restart | stop
  std::vector<RankStack> ranks;
  std::vector<StackGroup> groups;      // merge_stacks(ranks)
  std::vector<std::string> not_taken;  // "rank 3 (node b, pid 7): eu-stack not found on PATH"
  std::string timer_scope;             // kind == "timer": the expired scope
  double timeout_s = 0;                // kind == "hang": --hang-timeout (0: not named)
};

struct StragglerFinding {
  int rank = 0;
  int local_rank = 0;
  std::string node;
  double step_s = 0;    // its median step time
  double median_s = 0;  // the job's median
  int steps = 0;        // over how many steps
};

std::string format_hang(const HangFinding& f);            // console text, many lines
std::string hang_json(const HangFinding& f);              // hang_report.json
std::string hang_error_message(const HangFinding& f);     // one paragraph for error files
std::string format_straggler(const StragglerFinding& s);  // one console line
std::string stragglers_json(const std::vector<StragglerFinding>& s);

}  // namespace ddp::launch
