// The language model's training engine on one rank of a dp x tp mesh: the tensor-parallel model
// (lm_model.hpp) over this rank's tp part of the parameters, data parallelism across its dp group
// with the sharding levels of issue 19 applied to that part (none: gradients all-reduced;
// optimizer: each dp rank steps 1/D of every unit and all-gathers it; gradients: + gradients
// reduce-scattered as each unit's backward completes; full: + parameters held as 1/D shards,
// each unit gathered just before it runs and freed after, the root kept from forward to
// backward, FSDP2's fully_shard per block), and the optimizer over what the rank owns.
// Every unit's tp-local part is cut evenly over the dp ranks (worker::even_shards); rank d holds
// part d of every unit ("its shard"), in unit order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lm_model.hpp"
#include "lm_spec.hpp"
#include "optimizer.hpp"
#include "shard_layout.hpp"
#include "shard_ranges.hpp"

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

class SnapshotReader;

// What rank (d, t) of a dp x tp mesh writes to a snapshot: its dp part of each unit of its tp
// part, in canonical tensor coordinates, per tensor (empty for a replicated tensor when t > 0,
// whose copy at t = 0 is the one saved). The ranks' ranges tile every tensor exactly once.
FileRanges lm_owned_ranges(const LmConfig& c, int dp, int tp, int d, int t);

class LmEngine {
 public:
  // tp, dp: this rank's groups (null for a group of one).
  LmEngine(const LmConfig& c, worker::Communicator* tp, worker::Communicator* dp, Sharding level,
           const OptimizerConfig& opt);
  ~LmEngine();

  // The initial values (lm_init_slice), each rank drawing only what it holds.
  void init(std::uint64_t seed);
  // One optimizer step on this rank's `batch` sequences; returns its summed loss (the loss's
  // gradient is scaled by `scale`). Collective over tp and dp.
  double step(const std::int32_t* tokens, const std::int32_t* targets, std::size_t batch,
              float scale);
  // Summed loss of `batch` sequences, forward only (collective).
  double eval(const std::int32_t* tokens, const std::int32_t* targets, std::size_t batch);

  const LmConfig& config() const;
  const TpLayout& layout() const;
  Sharding sharding() const { return level_; }
  Optimizer& optimizer() { return *opt_; }
  int dp_size() const { return dp_size_; }
  int dp_rank() const { return dp_rank_; }

  // This rank's owned elements (lm_owned_ranges) in canonical tensor order: parameters into
  // params (sum of the ranges' sizes) and, when opt is not null, each piece of optimizer state
  // (pieces arrays of that size).
  void owned(float* params, float* opt, int pieces) const;
  // Loads the parameters (and the optimizer state when `with_state`) from a snapshot of any
  // mesh: reads this rank's tp part and keeps what it holds.
  void load(const SnapshotReader& r, bool with_state);
  // (sum, sum of squares) of every parameter of the whole model in double: collective; the
  // same at every mesh and level for the same parameters (up to the sums' order).
  std::pair<double, double> fingerprint();

 private:
  class Memory;
  LmConfig c_;
  Sharding level_;
  worker::Communicator* dp_;
  int dp_size_ = 1;
  int dp_rank_ = 0;
  std::unique_ptr<LmModel> model_;
  std::unique_ptr<Memory> mem_;
  std::unique_ptr<Optimizer> opt_;
};

}  // namespace ddp::train
