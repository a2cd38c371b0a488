// Rank 0's reports during and after training: the progress line (a bar on a terminal) and the
// test-set evaluation (accuracy for the classifier, mse for the regressions), which also goes
// into the metrics file.
#pragma once

#include <cstdint>
#include <iosfwd>
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

}  // namespace ddp::train
