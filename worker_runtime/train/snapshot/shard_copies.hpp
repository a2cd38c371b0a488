// In-memory copies of the ranks' shards, for in-place recovery of sharded engines (issue 34).
// A sharded rank's parameters and optimizer state live on that rank alone, so each rank also
// keeps two copies, taken together by keep() every --shard-copy-every steps:
//   - its own shard (so that it can go back to that step), and
//   - its predecessor's ((r - 1) mod W), received over the communicator (exchange()).
// When ranks die, heal() gives every rank the state to continue from, all at the step of the
// last keep(): survivors their own copy, a replacement its shard from its successor's copy.
// What is lost when both holders of a shard die at once (a rank and its successor), or when the
// copies are at different steps (a death during keep() itself): heal() throws ProtocolError and
// the job restarts from the last snapshot on disk.
// Cost: two shard-sized buffers per rank, and each keep() sends one shard to one peer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

class ShardCopies {
 public:
  // Where a copy stands: epoch, step (next micro-batch), global step, optimizer steps.
  using Head = std::array<std::int64_t, 4>;

  // Collective. `state` (this rank's shard, bytes) at `head` becomes this rank's own copy and
  // goes to its successor; the predecessor's (pred_floats long) arrives in its place.
  void keep(worker::Communicator& comm, const Head& head, std::vector<float> state,
            std::size_t pred_floats);

  struct Healed {
    Head head{};               // where every rank goes on from
    std::vector<float> state;  // this rank's shard at head
    int from = -1;             // the rank whose copy it is
  };
  // Collective, over the communicator rebuilt after the deaths. `replacement`: this rank holds
  // nothing (a new process); its shard (my_floats long) comes from its successor. Throws
  // ProtocolError naming the shard without a copy, or the ranks whose copies disagree.
  Healed heal(worker::Communicator& comm, bool replacement, std::size_t my_floats);

  bool holds() const { return own_head_[2] >= 0; }
  std::size_t bytes() const { return (own_.size() + pred_.size()) * sizeof(float); }

 private:
  Head own_head_{-1, -1, -1, -1};
  std::vector<float> own_;
  Head pred_head_{-1, -1, -1, -1};
  std::vector<float> pred_;
};

// Which rank must the job restart for, from the ranks' copies: pure, for heal() and its tests.
// held[r] = {own copy's global step, predecessor's copy's global step}, -1 for none (a
// replacement holds neither). Returns "" when every shard has a copy at one step (then *step is
// that step), else the reason.
std::string copies_unusable(const std::vector<std::array<std::int64_t, 2>>& held,
                            std::int64_t* step);

}  // namespace ddp::train
