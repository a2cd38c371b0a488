// Ranks grouped by identical main-thread stack, as LLNL's STAT merges a job's stacks: the odd
// one out is the suspect. Groups come smallest first; among equal sizes, a group with no
// collective frame (all_reduce, barrier, broadcast, allgather, wait...) first, then the one with
// the lowest step, then the lowest rank. Pure.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/launch/stacks.hpp"

namespace ddp::launch {

struct RankStack {
  int rank = 0;
  int local_rank = 0;
  std::string node;  // host name
  pid_t pid = 0;
  std::int64_t step = -1;
  std::string phase;
  ProcessStacks stacks;
  bool stalled = false;  // the leader's verdict: no progress for the timeout (not sent)
};

struct StackGroup {
  std::vector<int> ranks;              // sorted
  std::vector<std::string> signature;  // function names, outermost first
  bool in_collective = false;
  std::int64_t min_step = -1;
  bool stalled = false;  // holds a stalled rank
};

// The function names a frame list is grouped by, outermost first (addresses and line numbers
// dropped, so two ranks in the same call are equal).
std::vector<std::string> stack_signature(const std::vector<Frame>& innermost_first);
bool is_collective_frame(const std::string& function);

std::vector<StackGroup> merge_stacks(const std::vector<RankStack>& ranks);

// One node's ranks and stacks as compact JSON for the store, and back (throws ProtocolError).
std::string rank_stacks_to_json(const std::vector<RankStack>& ranks);
std::vector<RankStack> rank_stacks_from_json(std::string_view text);

}  // namespace ddp::launch
