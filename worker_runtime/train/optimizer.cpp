// SGD, Adam and Adadelta steps (see optimizer.hpp); the arithmetic is in ddp_kernels' CPU
// references.
#include "optimizer.hpp"

#include "ddp/kernels/conv_ref.hpp"
#include "ddp/kernels/cpu_ref.hpp"

namespace ddp::train {

Optimizer::Optimizer(OptimizerConfig config, std::size_t params)
    : config_(std::move(config)), n_(params) {
  switch (config_.kind) {
    case OptimizerKind::adam:
    case OptimizerKind::adadelta: state_.assign(2 * n_, 0.0f); break;
    case OptimizerKind::sgd:
      if (config_.momentum != 0.0f) state_.assign(n_, 0.0f);
      break;
  }
}

void Optimizer::step(float* params, const float* grads) {
  ++steps_;
  switch (config_.kind) {
    case OptimizerKind::adam:
      kernels::cpu::adam_step(params, grads, state_.data(), state_.data() + n_, n_, config_.lr,
                              config_.beta1, config_.beta2, config_.eps, steps_);
      break;
    case OptimizerKind::adadelta:
      kernels::cpu::adadelta_step(params, grads, state_.data(), state_.data() + n_, n_, config_.lr,
                                  config_.rho, config_.ada_eps);
      break;
    case OptimizerKind::sgd:
      kernels::cpu::sgd_step(params, grads, state_.empty() ? nullptr : state_.data(), n_,
                             config_.lr, config_.momentum, steps_ == 1);
      break;
  }
}

}  // namespace ddp::train
