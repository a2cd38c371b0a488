// The job's trace: each node's launcher phases and its ranks' steps, merged into one Chrome /
// Perfetto trace file (--trace FILE; the Trace Event Format's JSON object form) on the wall
// clock, one process per node, one thread for the launcher and one per rank.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddp/launch/progress.hpp"
#include "ddp/status/record.hpp"

namespace ddp::launch {

struct RankSteps {
  int rank = 0;
  std::vector<StepSpan> steps;  // oldest first
};

struct NodeTrace {
  int slot = 0;
  std::string host;
  int group_rank = -1;
  std::vector<status::Phase> phases;       // the launcher's, oldest first
  std::map<int, RankSteps> ranks;          // by local rank
};

// The node's part as it travels through the store (compact JSON; throws ddp::ProtocolError).
std::string encode_node_trace(const NodeTrace& t);
NodeTrace decode_node_trace(const std::string& text);

// One Chrome trace JSON document of all nodes, timestamps in microseconds from the earliest
// event, events of every node sorted by time.
std::string chrome_trace(const std::vector<NodeTrace>& nodes);

}  // namespace ddp::launch
