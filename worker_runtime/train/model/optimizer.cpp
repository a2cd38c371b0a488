// SGD, Adam, AdamW and Adadelta steps (see optimizer.hpp); the arithmetic is in ddp_kernels' CPU
// references.
#include "optimizer.hpp"

#include "ddp/kernels/conv_ref.hpp"
#include "ddp/kernels/cpu_ref.hpp"

namespace ddp::train {

Optimizer::Optimizer(OptimizerConfig config, std::size_t params)
    : config_(std::move(config)), n_(params) {
  switch (config_.kind) {
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::adadelta: state_.assign(2 * n_, 0.0f); break;
    case OptimizerKind::sgd:
      if (config_.momentum != 0.0f) state_.assign(n_, 0.0f);
      break;
  }
}

void Optimizer::step(float* params, const float* grads) { step({{params, grads, 0, n_}}); }

void Optimizer::step(const std::vector<Part>& parts) {
  ++steps_;
  float* s0 = state_.data();
  float* s1 = state_.size() >= 2 * n_ ? state_.data() + n_ : nullptr;
  for (const Part& p : parts) {
    if (p.count == 0) continue;
    const std::size_t o = p.offset;
    switch (config_.kind) {
      case OptimizerKind::adamw:
        kernels::cpu::scale(p.params, p.count, 1.0f - config_.lr * config_.weight_decay);
        [[fallthrough]];
      case OptimizerKind::adam:
        kernels::cpu::adam_step(p.params, p.grads, s0 + o, s1 + o, p.count, config_.lr,
                                config_.beta1, config_.beta2, config_.eps, steps_);
        break;
      case OptimizerKind::adadelta:
        kernels::cpu::adadelta_step(p.params, p.grads, s0 + o, s1 + o, p.count, config_.lr,
                                    config_.rho, config_.ada_eps);
        break;
      case OptimizerKind::sgd:
        kernels::cpu::sgd_step(p.params, p.grads, state_.empty() ? nullptr : s0 + o, p.count,
                               config_.lr, config_.momentum, steps_ == 1);
        break;
    }
  }
}

}  // namespace ddp::train
