// Where a step's arithmetic runs: the CPU (BLAS and the CPU references, gradients all-reduced
// by the host communicator) or a CUDA device (cuBLAS and our kernels, gradients all-reduced by
// NCCL on a side stream). The training loop (trainer.cpp) is the same for both. The host copy
// of the parameters and optimizer state (model(), optimizer()) is what snapshots, broadcasts and
// checksums use: download() refreshes it from the device, upload() sends it there.
#pragma once

#include <functional>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model.hpp"
#include "optimizer.hpp"
#include "options.hpp"
#include "shard_layout.hpp"

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
  // True when predict() is collective (full sharding gathers each layer): every rank must then
  // evaluate, in step.
  virtual bool collective_predict() const { return false; }

  // Sharded engines: which part of every layer this rank holds, and its shard of the
  // parameters (optimizer().state() then covers the shard only). Null for replicated engines,
  // whose parameters are model().params().
  virtual const ShardLayout* shard_layout() const { return nullptr; }
  virtual float* shard_params() { return nullptr; }
  virtual Sharding sharding() const { return Sharding::none; }
  // FNV-1a 64 of the whole parameter vector in the flat layout; collective on a sharded engine
  // (every rank calls it), and the same value at every sharding level for the same parameters.
  virtual std::uint64_t param_checksum();
  // The most bytes of parameters, gradients and optimizer state this rank held at once
  // (gathered layers and unsharded gradients included).
  virtual std::size_t state_bytes_peak() const;

  // In-place recovery (docs/ddp_train.md): after step() threw because a peer died, drops the
  // step (gradients zeroed, its loss forgotten), lets go of the communicator (its collective
  // threads stopped first), calls `reconnect` for the new one and uses it. False, doing
  // nothing: this engine cannot recover in place (the job restarts as torchrun's would).
  virtual bool heal(const std::function<worker::Communicator*()>& reconnect) {
    (void)reconnect;
    return false;
  }

 protected:
  Engine(ModelSpec spec, const OptimizerConfig& opt, bool own_buffers = true,
         std::size_t opt_params = 0)
      : model_(std::move(spec), own_buffers),
        opt_(opt, own_buffers && opt_params == 0 ? model_.param_count() : opt_params) {}
  Model model_;
  Optimizer opt_;
};

// comm may be null (one process).
std::unique_ptr<Engine> make_cpu_engine(ModelSpec spec, const OptimizerConfig& opt,
                                        worker::Communicator* comm, double bucket_cap_mb);

// A sharded CPU engine (sharded_engine.cpp): `level` other than none; comm may be null (one
// rank: the shard is the whole model). prefetch: gather the next layer while this one computes.
std::unique_ptr<Engine> make_sharded_engine(ModelSpec spec, const OptimizerConfig& opt,
                                            worker::Communicator* comm, Sharding level,
                                            bool prefetch, double bucket_cap_mb);

struct CudaEngineOptions {
  int device = 0;
  std::size_t max_rows = 0;  // the largest micro-batch or evaluation chunk (kPredictChunkRows)
  Precision precision = Precision::fp32;  // bf16: bf16 matrix products, the rest fp32
  double bucket_cap_mb = 25.0;
  // In-place recovery: the next generation's NCCL communicator (TrainContext::reconnect_device);
  // empty, a peer's death restarts the job.
  std::function<worker::Communicator*()> reconnect_device;
};
// comm: an NCCL communicator (make_nccl_communicator) or null for one process. Throws
// ConfigError in a build without CUDA.
std::unique_ptr<Engine> make_cuda_engine(ModelSpec spec, const OptimizerConfig& opt,
                                         worker::Communicator* comm, const CudaEngineOptions& o);
// The sharded CUDA engine (cuda_sharded_engine.cpp): fp32 master shards on the device, layers
// gathered and gradients reduce-scattered through `comm` (the nccl communicator; null for one
// rank); `level` none is make_cuda_engine. Throws ConfigError in a build without CUDA.
std::unique_ptr<Engine> make_cuda_sharded_engine(ModelSpec spec, const OptimizerConfig& opt,
                                                 worker::Communicator* comm, Sharding level,
                                                 bool prefetch, const CudaEngineOptions& o);

// The engine the options ask for (device, sharding), over the context's communicators.
struct TrainContext;
std::unique_ptr<Engine> make_engine(const TrainOptions& o, const TrainContext& c);

}  // namespace ddp::train
