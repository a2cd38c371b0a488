// The training loop of ddp-train: data split as DistributedSampler does, forward, backward with
// bucketed all-reduce, the optimizer step, snapshots (periodic, on signals, on a peer's failure),
// resume, progress, evaluation and the metrics file. Options come parsed; the communicator comes
// connected (or null for one process).
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "optimizer.hpp"

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

struct TrainOptions {
  int total_epochs = 0;
  int save_every = 0;
  int batch_size = 32;
  std::string model;  // empty: mlp, or linear for the synthetic dataset
  std::string dataset = "fashion-mnist";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::size_t train_subset = 0;
  std::size_t synthetic_size = 2048;
  OptimizerConfig optimizer;
  std::uint64_t seed = 0;
  int grad_accum = 1;
  std::string snapshot = "snapshot.ddp";
  std::string metrics_json;
  double bucket_cap_mb = 25.0;
  std::int64_t max_steps = 0;
  int log_every = 0;
  bool eval = true;
  std::string fault;               // DDP_TRAIN_FAULT "RANK:STEP"
  std::string device = "cpu";      // "cpu" | "cuda" (main resolves "auto")
  std::string precision = "fp32";  // "fp32" | "bf16" (cuda only)
};

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

// Checks the options (ConfigError naming the option); fills defaults (the model).
void validate(TrainOptions& options);
// Returns the exit code: 0 when done, 128 + signal when stopped by one. Throws on errors.
int train(const TrainOptions& options, const TrainContext& ctx);

}  // namespace ddp::train
