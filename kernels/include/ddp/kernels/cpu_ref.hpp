// The element-wise parts of the trainer on the CPU: bias, activations, losses and optimizer
// updates. ddp-train uses them on the CPU path, and they are the references the CUDA kernels
// (issue 6) are checked against. Row-major [rows][cols] buffers; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp::kernels::cpu {

// y[r][c] += b[c]
void add_bias(float* y, const float* b, std::size_t rows, std::size_t cols);
// db[c] += sum over r of dy[r][c]
void sum_rows(const float* dy, float* db, std::size_t rows, std::size_t cols);

void relu_forward(float* y, std::size_t n);                       // in place
void relu_backward(float* dy, const float* y, std::size_t n);     // dy *= (y > 0)
void sigmoid_forward(float* y, std::size_t n);                    // in place
void sigmoid_backward(float* dy, const float* y, std::size_t n);  // dy *= y (1 - y)

// Softmax cross-entropy on logits [rows][classes] against integer labels: returns the summed
// loss; dlogits = scale * (softmax - onehot). Numerically stable (max subtracted).
double softmax_xent(const float* logits, const std::uint8_t* labels, float* dlogits,
                    std::size_t rows, std::size_t classes, float scale);
// Counts rows whose arg-max equals the label.
std::size_t count_correct(const float* logits, const std::uint8_t* labels, std::size_t rows,
                          std::size_t classes);
// Mean-squared error: returns sum over all elements of (y - t)^2; dy = scale * 2 (y - t).
double mse(const float* y, const float* t, float* dy, std::size_t n, float scale);

void scale(float* x, std::size_t n, float factor);

// torch.optim.SGD: buf = momentum * buf + g (buf = g on the first step); p -= lr * buf.
void sgd_step(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum,
              bool first_step);
// torch.optim.Adam (no weight decay, not amsgrad); t is the step number starting at 1.
void adam_step(float* p, const float* g, float* m, float* v, std::size_t n, float lr, float beta1,
               float beta2, float eps, std::int64_t t);

// fp32 -> bf16 by round to nearest even (NaN stays NaN), and back (exact). bf16 as its 16 bits.
std::uint16_t f32_to_bf16(float x);
float bf16_to_f32(std::uint16_t x);

}  // namespace ddp::kernels::cpu
