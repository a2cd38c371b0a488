// torch.optim.SGD (with momentum), torch.optim.Adam, torch.optim.AdamW and torch.optim.Adadelta
// over the flat parameter buffer. The state is one flat float vector, so snapshots store it as is.
// The learning rate can change between steps (set_lr: the trainer's per-epoch StepLR schedule).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp::train {

enum class OptimizerKind { sgd, adam, adadelta, adamw };  // --optimizer (options.hpp names them)

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 1e-3f;
  float momentum = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;           // Adam's
  float weight_decay = 0.01f;  // AdamW's (torch's default): p *= 1 - lr * weight_decay first
  float rho = 0.9f;            // Adadelta's (torch's defaults)
  float ada_eps = 1e-6f;
};

class Optimizer {
 public:
  Optimizer(OptimizerConfig config, std::size_t params);
  void step(float* params, const float* grads);
  // One step over pieces of the parameters (a sharded engine's parts of every layer): piece i
  // updates count floats at params / grads with the state at `offset` of each state array. The
  // step count advances once.
  struct Part {
    float* params;
    const float* grads;
    std::size_t offset;
    std::size_t count;
  };
  void step(const std::vector<Part>& parts);
  const OptimizerConfig& config() const { return config_; }
  // The learning rate of the next steps (a scheduler's; lr must be positive and finite).
  void set_lr(float lr) { config_.lr = lr; }
  // SGD: momentum buffer; Adam: m, then v; Adadelta: square_avg, then acc_delta.
  std::vector<float>& state() { return state_; }
  const std::vector<float>& state() const { return state_; }
  std::int64_t steps() const { return steps_; }  // snapshots' adam_t, for every kind
  void set_steps(std::int64_t t) { steps_ = t; }

 private:
  OptimizerConfig config_;
  std::size_t n_;
  std::vector<float> state_;
  std::int64_t steps_ = 0;
};

}  // namespace ddp::train
