// The training loop of ddp-train: data split as DistributedSampler does, forward, backward with
// bucketed all-reduce, the optimizer step, snapshots (periodic, on signals, on a peer's failure),
// resume, progress, evaluation and the metrics file. Options come parsed and checked
// (options.hpp); the communicator comes connected (or null for one process).
#pragma once

#include <atomic>
#include <iosfwd>

#include "options.hpp"

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

struct TrainContext {
  int rank = 0;
  int world = 1;
  int restart_count = 0;
  worker::Communicator* comm = nullptr;         // host collectives (broadcast, CPU gradients)
  worker::Communicator* device_comm = nullptr;  // NCCL, for the CUDA engine's gradients
  int cuda_device = 0;
  const std::atomic<int>* stop_signal = nullptr;  // SIGTERM/SIGINT number, 0 while none
  std::atomic<bool>* save_request = nullptr;      // SIGUSR1
  std::ostream* out = nullptr;                    // rank 0's progress
  bool tty = false;                               // progress bar instead of lines
};

// Returns the exit code: 0 when done, 128 + signal when stopped by one. Throws on errors.
int train(const TrainOptions& options, const TrainContext& ctx);

}  // namespace ddp::train
