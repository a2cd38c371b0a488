// SGD, Adam, AdamW and Adadelta steps (see optimizer.hpp); the arithmetic is in ddp_kernels' CPU
// references.
#include "optimizer.hpp"

#include "conv_gemm.hpp"

#include "ddp/kernels/conv_ref.hpp"
#include "ddp/kernels/cpu_ref.hpp"

namespace ddp::train {

namespace {
// The least elements a thread takes (a thread costs tens of microseconds to start).
constexpr std::size_t kMinStepPerThread = std::size_t{1} << 16;
}  // namespace

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
  for (const Part& part : parts) {
    if (part.count == 0) continue;
    // Element-wise: cut over the conv threads (one range unless the convnet set them), no bit
    // changes.
    parallel_ranges(part.count, kMinStepPerThread, [&](std::size_t lo, std::size_t hi) {
      float* p = part.params + lo;
      const float* g = part.grads + lo;
      const std::size_t o = part.offset + lo, n = hi - lo;
      switch (config_.kind) {
        case OptimizerKind::adamw:
          kernels::cpu::scale(p, n, 1.0f - config_.lr * config_.weight_decay);
          [[fallthrough]];
        case OptimizerKind::adam:
          kernels::cpu::adam_step(p, g, s0 + o, s1 + o, n, config_.lr, config_.beta1, config_.beta2,
                                  config_.eps, steps_);
          break;
        case OptimizerKind::adadelta:
          kernels::cpu::adadelta_step(p, g, s0 + o, s1 + o, n, config_.lr, config_.rho,
                                      config_.ada_eps);
          break;
        case OptimizerKind::sgd:
          kernels::cpu::sgd_step(p, g, state_.empty() ? nullptr : s0 + o, n, config_.lr,
                                 config_.momentum, steps_ == 1);
          break;
      }
    });
  }
}

}  // namespace ddp::train
