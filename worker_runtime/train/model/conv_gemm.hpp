// Conv2d on the CPU for the trainer: im2col + sgemm (BLAS), the fast path of the MNIST convnet.
// Equal to the plain-loop references in ddp/kernels/conv_ref.hpp within float rounding (the
// unit tests check it). `cols` is the caller's scratch, grown as needed.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "ddp/kernels/conv_ref.hpp"

namespace ddp::train {

// The threads a convolution splits its batch over (contiguous ranges of samples, each with
// single-threaded BLAS calls); process-wide, like OpenBLAS's own thread count. 1 (the default):
// one range, BLAS as configured. ddp-train sets --threads here for the convnet and runs BLAS on
// one thread (OpenBLAS's idle threads spin and would compete with these). Results depend on the
// count (the order of the weight-gradient sums), never on timing. Clamped to [1, 64].
inline constexpr int kMaxConvThreads = 64;
void set_conv_threads(int n);
int conv_threads();

// Runs fn(lo, hi) over [0, n) cut into up to conv_threads() contiguous ranges side by side (one
// on the calling thread), each at least min_per_range long: the element-wise layers around the
// convolutions (activations, pooling, dropout), whose results do not depend on the cut.
void parallel_ranges(std::size_t n, std::size_t min_per_range,
                     const std::function<void(std::size_t, std::size_t)>& fn);

// C = alpha * op(A) * op(B) + beta * C (row-major cblas_sgemm) with C's n columns cut into up to
// conv_threads() ranges of at least 64, one single-threaded BLAS call each, side by side: the
// linear layers around the convolutions. OpenBLAS sums a tile at a block's edge in another
// order than one inside it, so the cut moves some elements' last bits: like the convolutions',
// the results depend on the thread count, never on timing (one thread: cblas_sgemm's bits).
void parallel_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc);

// y = conv(x, w) + b, shapes as kernels::Conv2dShape.
void conv2d_gemm_forward(const float* x, const float* w, const float* b, float* y,
                         const kernels::Conv2dShape& s, std::vector<float>& cols);
// dw += dL/dw, db += dL/db; dx (overwritten) = dL/dx unless dx is null (the first layer).
void conv2d_gemm_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          float* db, const kernels::Conv2dShape& s, std::vector<float>& cols);

}  // namespace ddp::train
