// The CPU engine: Model + Optimizer + GradReducer, and make_engine(), which picks the engine
// the options ask for (see engine.hpp).
#include "engine.hpp"

#include <algorithm>

#include "ddp/proto/error.hpp"
#include "reducer.hpp"
#include "snapshot.hpp"
#include "trainer.hpp"

namespace ddp::train {

std::uint64_t Engine::param_checksum() {
  download();
  return fnv1a64(model_.params().data(), model_.params().size() * sizeof(float));
}

std::size_t Engine::state_bytes_peak() const {
  return (2 * model_.param_count() + opt_.state().size()) * sizeof(float);
}

namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(ModelSpec spec, const OptimizerConfig& opt, worker::Communicator* comm,
            double bucket_cap_mb)
      : Engine(std::move(spec), opt),
        buckets_(plan_buckets(model_, std::size_t{1} << 20,
                              static_cast<std::size_t>(bucket_cap_mb * 1024 * 1024))),
        reducer_(std::make_unique<GradReducer>(comm, model_.grads().data(), buckets_)) {}

  std::string device() const override { return "cpu"; }
  std::size_t bucket_count() const override { return reducer_->buckets().size(); }

  void micro_batch(const float* x, const std::uint8_t* labels, const float* targets,
                   std::size_t rows, float scale, bool sync) override {
    model_.forward(x, rows, true);
    loss_ += model_.loss(labels, targets, rows, scale) / static_cast<double>(rows);
    if (sync) {
      model_.backward(x, rows, [&](std::size_t layer) { reducer_->layer_done(layer); });
    } else {
      model_.backward(x, rows, nullptr);
    }
  }

  double step() override {
    reducer_->finish();
    opt_.step(model_.params().data(), model_.grads().data());
    model_.zero_grads();
    const double loss = loss_;
    loss_ = 0.0;
    return loss;
  }

  const float* predict(const float* x, std::size_t rows) override {
    return model_.forward(x, rows);
  }

  // The reducer's thread goes first (it may still hold the old communicator), then the step's
  // gradients (partly reduced or not) and loss; the parameters were never touched (step()
  // throws before the optimizer runs).
  bool heal(const std::function<worker::Communicator*()>& reconnect) override {
    reducer_.reset();
    model_.zero_grads();
    loss_ = 0.0;
    reducer_ = std::make_unique<GradReducer>(reconnect(), model_.grads().data(), buckets_);
    return true;
  }

 private:
  std::vector<Bucket> buckets_;
  std::unique_ptr<GradReducer> reducer_;
  double loss_ = 0.0;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(ModelSpec spec, const OptimizerConfig& opt,
                                        worker::Communicator* comm, double bucket_cap_mb) {
  return std::make_unique<CpuEngine>(std::move(spec), opt, comm, bucket_cap_mb);
}

std::unique_ptr<Engine> make_engine(const TrainOptions& o, const TrainContext& c) {
  switch (o.device) {
    case Device::cuda: {
      CudaEngineOptions co;
      co.device = c.cuda_device;
      co.max_rows = std::max(static_cast<std::size_t>(o.batch_size), kPredictChunkRows);
      co.precision = o.precision;
      co.bucket_cap_mb = o.bucket_cap_mb;
      co.reconnect_device = c.reconnect_device;
      if (o.sharding != Sharding::none) {
        return make_cuda_sharded_engine(model_spec(o.model, o.hidden, o.layers), o.optimizer,
                                        c.device_comm, o.sharding, o.prefetch, co);
      }
      return make_cuda_engine(model_spec(o.model, o.hidden, o.layers), o.optimizer, c.device_comm,
                              co);
    }
    case Device::cpu: break;
  }
  if (o.sharding != Sharding::none) {
    return make_sharded_engine(model_spec(o.model, o.hidden, o.layers), o.optimizer, c.comm,
                               o.sharding, o.prefetch, o.bucket_cap_mb);
  }
  return make_cpu_engine(model_spec(o.model, o.hidden, o.layers), o.optimizer, c.comm,
                         o.bucket_cap_mb);
}

#if !defined(DDP_WITH_CUDA)
std::unique_ptr<Engine> make_cuda_engine(ModelSpec, const OptimizerConfig&, worker::Communicator*,
                                         const CudaEngineOptions&) {
  throw ConfigError("--device cuda: this ddprun was built without CUDA (DDP_WITH_CUDA=OFF)");
}
std::unique_ptr<Engine> make_cuda_sharded_engine(ModelSpec, const OptimizerConfig&,
                                                 worker::Communicator*, Sharding, bool,
                                                 const CudaEngineOptions&) {
  throw ConfigError("--device cuda: this ddprun was built without CUDA (DDP_WITH_CUDA=OFF)");
}
#endif

}  // namespace ddp::train
