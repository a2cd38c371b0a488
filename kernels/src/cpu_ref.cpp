// CPU references of the element-wise kernels (see cpu_ref.hpp).
#include "ddp/kernels/cpu_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ddp::kernels::cpu {

void add_bias(float* y, const float* b, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (std::size_t c = 0; c < cols; ++c) row[c] += b[c];
  }
}

void sum_rows(const float* dy, float* db, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for (std::size_t c = 0; c < cols; ++c) db[c] += row[c];
  }
}

void relu_forward(float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

void relu_backward(float* dy, const float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void sigmoid_forward(float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-y[i]));
}

void sigmoid_backward(float* dy, const float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dy[i] *= y[i] * (1.0f - y[i]);
}

double softmax_xent(const float* logits, const std::uint8_t* labels, float* dlogits,
                    std::size_t rows, std::size_t classes, float scale) {
  double total = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    float* dz = dlogits + r * classes;
    const float zmax = *std::max_element(z, z + classes);
    double sum = 0.0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    const std::size_t label = labels[r];
    total += log_sum - static_cast<double>(z[label] - zmax);
    for (std::size_t c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(z[c] - zmax) - log_sum);
      dz[c] = scale * static_cast<float>(p - (c == label ? 1.0 : 0.0));
    }
  }
  return total;
}

std::size_t count_correct(const float* logits, const std::uint8_t* labels, std::size_t rows,
                          std::size_t classes) {
  std::size_t correct = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    const auto best = static_cast<std::size_t>(std::max_element(z, z + classes) - z);
    if (best == labels[r]) ++correct;
  }
  return correct;
}

double mse(const float* y, const float* t, float* dy, std::size_t n, float scale) {
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = y[i] - t[i];
    total += static_cast<double>(d) * d;
    dy[i] = scale * 2.0f * d;
  }
  return total;
}

void scale(float* x, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
}

void sgd_step(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum,
              bool first_step) {
  if (momentum == 0.0f) {
    for (std::size_t i = 0; i < n; ++i) p[i] -= lr * g[i];
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    buf[i] = first_step ? g[i] : momentum * buf[i] + g[i];
    p[i] -= lr * buf[i];
  }
}

void adam_step(float* p, const float* g, float* m, float* v, std::size_t n, float lr, float beta1,
               float beta2, float eps, std::int64_t t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const auto step_size = static_cast<float>(lr / bc1);
  const auto bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * m[i] / denom;
  }
}

std::uint16_t f32_to_bf16(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // stays a quiet NaN
  const std::uint32_t rounding = 0x7fff + ((bits >> 16) & 1);                 // ties to even
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float bf16_to_f32(std::uint16_t x) {
  const std::uint32_t bits = std::uint32_t{x} << 16;
  float out = 0.0f;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace ddp::kernels::cpu
