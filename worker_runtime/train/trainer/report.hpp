// Rank 0's reports during and after training: the progress line (a bar on a terminal) and the
// test-set evaluation (accuracy for the classifier, mse for the regressions), which also goes
// into the metrics file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "data.hpp"
#include "engine.hpp"

namespace ddp::train {

struct ProgressLine {
  std::int64_t epoch = 0;  // from 0
  std::int64_t epochs = 0;
  std::int64_t step = 0;  // micro-batches done in the epoch
  std::int64_t steps = 0;
  double loss = 0.0;
  double samples_per_sec = 0.0;
  bool end = false;  // the epoch's last line (ends the bar's line on a terminal)
};

// "epoch E/N step S/M loss L samples/s R": one line each, or a redrawn bar when tty.
void print_progress(std::ostream& out, bool tty, const ProgressLine& p);

// Runs the model over `test` in chunks of kPredictChunkRows; prints and records test_accuracy
// (cross-entropy) or test_mse in `metrics`, and returns it. An empty test set: 0, nothing.
double evaluate(Engine& engine, const Dataset& test, std::ostream& out, nlohmann::json& metrics);

// What a finished run reports: the metrics file's figures besides the evaluation's.
struct RunSummary {
  std::string model;
  std::string dataset;
  int world_size = 1;
  int batch_size = 0;
  std::vector<double> epoch_losses;
  std::vector<double> step_losses;
  std::int64_t steps = 0;  // this run's
  std::int64_t global_step = 0;
  std::int64_t samples = 0;  // this run's, all ranks
  double seconds = 0.0;
  double final_loss = 0.0;
  std::uint64_t param_checksum = 0;
  std::string sharding;
  std::size_t state_bytes_peak = 0;
  std::optional<std::pair<std::int64_t, std::int64_t>> resumed_from;  // epoch, step
  std::string optimizer{};  // what trained: the recipe's or the command line's
  double lr = 0.0;
  double lr_gamma = 1.0;
};

// Rank 0's last words: the summary line on `out`, the evaluation on `test` when `eval`
// (before_eval is called first), and the metrics file at `path` unless it is empty (IoError
// when it cannot be written). rss_peak_bytes is read from /proc at the time.
void final_report(Engine& engine, const RunSummary& s, const Dataset& test, bool eval,
                  const std::string& path, std::ostream& out,
                  const std::function<void()>& before_eval);

}  // namespace ddp::train
