// Where a step's arithmetic runs: the CPU (BLAS and the CPU references, gradients all-reduced
// by the host communicator) or a CUDA device (cuBLAS and our kernels, gradients all-reduced by
// NCCL on a side stream). The training loop (trainer.cpp) is the same for both. The host copy
// of the parameters and optimizer state (model(), optimizer()) is what snapshots, broadcasts and
// checksums use: download() refreshes it from the device, upload() sends it there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model.hpp"
#include "optimizer.hpp"
#include "options.hpp"

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

// The most rows the evaluation hands predict() at once (trainer.cpp walks the test set in chunks
// of this size). An engine with fixed buffers (the CUDA engine's max_rows) must hold
// max(--batch-size, kPredictChunkRows) rows, or a small batch size would leave it too small for
// the evaluation's chunks.
constexpr std::size_t kPredictChunkRows = 1000;

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string device() const = 0;  // "cpu" or "cuda:<n> (<name>)"
  virtual std::size_t bucket_count() const = 0;
  Model& model() { return model_; }
  Optimizer& optimizer() { return opt_; }

  virtual void upload() {}
  virtual void download() {}
  // Forward, loss and backward of one micro-batch (rows <= the engine's batch capacity); the
  // loss's gradient is scaled by `scale`. `sync`: the step's last micro-batch, whose backward
  // starts each bucket's all-reduce as soon as the bucket is complete.
  virtual void micro_batch(const float* x, const std::uint8_t* labels, const float* targets,
                           std::size_t rows, float scale, bool sync) = 0;
  // Waits for the all-reduce (IoError or NcclError when a peer failed: the parameters are then
  // untouched), averages, takes the optimizer step, zeroes the gradients. Returns the sum over
  // the step's micro-batches of (summed loss / rows).
  virtual double step() = 0;
  // The model's output for x [rows][in] (rows <= the engine's capacity, see kPredictChunkRows),
  // in host memory owned by the engine.
  virtual const float* predict(const float* x, std::size_t rows) = 0;

 protected:
  Engine(ModelSpec spec, const OptimizerConfig& opt)
      : model_(std::move(spec)), opt_(opt, model_.param_count()) {}
  Model model_;
  Optimizer opt_;
};

// comm may be null (one process).
std::unique_ptr<Engine> make_cpu_engine(ModelSpec spec, const OptimizerConfig& opt,
                                        worker::Communicator* comm, double bucket_cap_mb);

struct CudaEngineOptions {
  int device = 0;
  std::size_t max_rows = 0;  // the largest micro-batch or evaluation chunk (kPredictChunkRows)
  Precision precision = Precision::fp32;  // bf16: bf16 matrix products, the rest fp32
  double bucket_cap_mb = 25.0;
};
// comm: an NCCL communicator (make_nccl_communicator) or null for one process. Throws
// ConfigError in a build without CUDA.
std::unique_ptr<Engine> make_cuda_engine(ModelSpec spec, const OptimizerConfig& opt,
                                         worker::Communicator* comm, const CudaEngineOptions& o);

}  // namespace ddp::train
