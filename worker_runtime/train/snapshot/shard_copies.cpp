// The shard copies of shard_copies.hpp: keep() is two exchanges (the head, then the shard) to
// the successor; heal() agrees on the step with one all-gather, then each replacement's
// successor sends it its copy (two exchanges).
#include "shard_copies.hpp"

#include <utility>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"

namespace ddp::train {

std::string copies_unusable(const std::vector<std::array<std::int64_t, 2>>& held,
                            std::int64_t* step) {
  const auto w = held.size();
  std::int64_t at = -1;
  std::size_t first = w;
  for (std::size_t r = 0; r < w; ++r) {
    if (held[r][0] < 0) continue;  // a replacement
    if (first == w) {
      first = r;
      at = held[r][0];
    } else if (held[r][0] != at) {
      return "the ranks' copies are at different steps (rank " + std::to_string(first) + " at " +
             std::to_string(at) + ", rank " + std::to_string(r) + " at " +
             std::to_string(held[r][0]) + ")";
    }
  }
  if (first == w) return "no rank holds a copy";
  for (std::size_t r = 0; r < w; ++r) {
    if (held[r][0] >= 0) continue;
    const std::size_t h = (r + 1) % w;  // its successor holds its shard
    if (held[h][0] < 0) {
      return "rank " + std::to_string(r) + "'s shard has no copy: its holder, rank " +
             std::to_string(h) + ", was replaced too";
    }
    if (held[h][1] != at) {
      return "rank " + std::to_string(r) + "'s shard has no copy at step " + std::to_string(at) +
             ": its holder, rank " + std::to_string(h) + ", has step " + std::to_string(held[h][1]);
    }
  }
  *step = at;
  return "";
}

void ShardCopies::keep(worker::Communicator& comm, const Head& head, std::vector<float> state,
                       std::size_t pred_floats) {
  const int w = comm.size();
  const int next = (comm.rank() + 1) % w;
  const int prev = (comm.rank() + w - 1) % w;
  own_ = std::move(state);
  own_head_ = head;
  Head got{};
  comm.exchange(own_head_.data(), sizeof(Head), next, got.data(), sizeof(Head), prev);
  pred_.resize(pred_floats);
  comm.exchange(own_.data(), own_.size() * sizeof(float), next, pred_.data(),
                pred_.size() * sizeof(float), prev);
  pred_head_ = got;
}

ShardCopies::Healed ShardCopies::heal(worker::Communicator& comm, bool replacement,
                                      std::size_t my_floats) {
  const int w = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % w;
  const int prev = (r + w - 1) % w;
  const std::array<std::int64_t, 2> mine = {replacement ? -1 : own_head_[2],
                                            replacement ? -1 : pred_head_[2]};
  std::vector<std::array<std::int64_t, 2>> held(static_cast<std::size_t>(w));
  comm.all_gather(mine.data(), held.data(), sizeof mine);
  std::int64_t step = -1;
  const std::string why = copies_unusable(held, &step);
  if (!why.empty()) {
    throw ProtocolError("in-place recovery of a sharded job: " + why +
                        "; the job restarts from its last snapshot");
  }
  // The successor of each replacement sends it its copy; a replacement receives from its own.
  const bool send = !replacement && held[static_cast<std::size_t>(prev)][0] < 0;
  Healed out;
  if (replacement) out.state.resize(my_floats);
  comm.exchange(pred_head_.data(), send ? sizeof(Head) : 0, send ? prev : -1, out.head.data(),
                replacement ? sizeof(Head) : 0, replacement ? next : -1);
  comm.exchange(pred_.data(), send ? pred_.size() * sizeof(float) : 0, send ? prev : -1,
                out.state.data(), replacement ? my_floats * sizeof(float) : 0,
                replacement ? next : -1);
  if (replacement) {
    out.from = next;
  } else {
    out.head = own_head_;
    out.state = own_;
    out.from = r;
  }
  return out;
}

}  // namespace ddp::train
