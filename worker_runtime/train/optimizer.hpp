// torch.optim.SGD (with momentum) and torch.optim.Adam over the flat parameter buffer. The
// state is one flat float vector, so snapshots store it as is.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::train {

enum class OptimizerKind { sgd, adam };  // --optimizer (options.hpp names them)

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 1e-3f;
  float momentum = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

class Optimizer {
 public:
  Optimizer(OptimizerConfig config, std::size_t params);
  void step(float* params, const float* grads);
  const OptimizerConfig& config() const { return config_; }
  std::vector<float>& state() { return state_; }  // SGD: momentum buffer; Adam: m, then v
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t t) { steps_ = t; }

 private:
  OptimizerConfig config_;
  std::size_t n_;
  std::vector<float> state_;
  std::int64_t steps_ = 0;
};

}  // namespace ddp::train
