// One ddp-train run of the replicated or sharded engines (not the LM's: lm_trainer.cpp), its
// state between the files that define it: trainer.cpp (setup, the loop of epochs and steps,
// progress, the report) and checkpoint.cpp (its snapshots, stops and in-place heals). Private
// to this folder.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "checkpoint.hpp"
#include "data.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/progress.hpp"
#include "engine.hpp"
#include "options.hpp"
#include "shard_copies.hpp"
#include "trainer.hpp"

namespace ddp::train::detail {

using Clock = std::chrono::steady_clock;

class Run {
 public:
  Run(const TrainOptions& o, const TrainContext& c)
      : o_(o),
        c_(c),
        engine_(make_engine(o, c)),
        model_(engine_->model()),
        opt_(engine_->optimizer()) {}

  int go();

 private:
  std::ostream& out() { return *c_.out; }
  bool leader() const { return c_.rank == 0; }
  // Setup: the data, then the parameters (initialised or resumed) on every rank.
  void load_data();
  void resume_or_init();
  void announce();
  // The loop: epochs of steps of micro-batches.
  void run_epoch(std::int64_t epoch);
  bool at_step_boundary();
  std::optional<double> step(const std::vector<std::uint32_t>& idx, std::int64_t mb,
                             std::int64_t group_end);
  std::size_t fill_batch(const std::vector<std::uint32_t>& idx, std::size_t first);
  void finish_epoch(std::int64_t epoch, std::int64_t nb, double mean);
  // Snapshots and stopping.
  void save(const Position& at, const char* why);
  void stop_on_signal(int signal, bool snapshot = true);
  bool heal_from(const Error& e);
  void kill_if(FaultKind kind, std::int64_t n, const char* where);
  void join_as_replacement();
  void agree_at_boundary(int& stop, bool& save_now);
  bool being_stopped(std::chrono::milliseconds wait = std::chrono::seconds(1)) const;
  // Reporting.
  void phase(const char* word, std::int64_t step, std::int64_t samples = -1) {
    if (c_.progress != nullptr) c_.progress->report(step, word, samples);
  }
  void progress(std::int64_t epoch, std::int64_t mb, std::int64_t nb, double loss, bool end);
  void report(double secs, std::uint64_t checksum);

  const TrainOptions& o_;
  TrainContext c_;  // a copy: in-place recovery replaces its communicator
  Dataset train_;
  Dataset test_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ShardCopies> copies_;  // sharded, in place: the shard copies
  Model& model_;                         // the host copy (engine.hpp)
  Optimizer& opt_;
  Position start_;
  bool resumed_ = false;
  std::optional<Position> last_saved_;
  Clock::time_point t0_;
  std::int64_t samples_ = 0;  // this run, all ranks
  // The loop's state.
  Position pos_;
  std::int64_t steps_this_run_ = 0;
  double last_loss_ = 0.0;
  std::vector<double> epoch_losses_;
  std::vector<double> step_losses_;  // rank 0's loss of each step of this run (the first 100k)
  bool stopping_ = false;            // a signal, --max-steps, or a peer that stopped ahead of us
  bool healed_ = false;              // step() dropped its step and healed: pos_ is the sender's
  int exit_code_ = 0;                // 128 + signal when a signal stopped the run
  std::vector<float> xb_;            // one micro-batch: inputs, labels, regression targets
  std::vector<std::uint8_t> lb_;
  std::vector<float> yb_;
};

}  // namespace ddp::train::detail
