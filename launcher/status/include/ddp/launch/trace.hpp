// The job's trace: each node's launcher phases and its ranks' steps, merged into one Chrome /
// Perfetto trace file (--trace FILE; the Trace Event Format's JSON object form) on the wall
// clock, one process per node, one thread for the launcher and one per rank.
#pragma once

#include <cstddef>
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
  std::vector<status::Phase> phases;  // the launcher's, oldest first
  std::map<int, RankSteps> ranks;     // by local rank
};

// Bounds of a node's trace: encode keeps the newest of each, decode refuses more.
inline constexpr std::size_t kTraceMaxPhases = 4096;
inline constexpr std::size_t kTraceMaxRanks = 1024;             // local ranks per node
inline constexpr std::size_t kTraceMaxBytes = 8 * 1024 * 1024;  // the store's value limit
// (steps per rank: kTraceSteps, progress.hpp)

// The node's part as it travels through the store (compact JSON: times as integer
// microseconds from the node's earliest one). decode throws ddp::ProtocolError naming the field.
//   {"v":1,"slot":S,"host":H,"group_rank":G,"t0":<unix s>,
//    "phases":[[name,start_us,end_us or -1 (still going),detail],...],
//    "ranks":[[local_rank,rank,[[step,start_us,dur_us],...]],...]}
std::string encode_node_trace(const NodeTrace& t);
NodeTrace decode_node_trace(const std::string& text);

// One Chrome trace JSON document of all nodes, timestamps in microseconds from the earliest
// event, events of every node sorted by time (metadata events first). A node is process
// slot+1 (named "node <host> (slot S, group rank G)"); thread 0 is its launcher (phases, cat
// "launcher"), thread L+1 its local rank L (steps "step N", cat "step"). A phase still going
// (end 0) ends at the last event of the whole trace.
std::string chrome_trace(const std::vector<NodeTrace>& nodes);

}  // namespace ddp::launch
