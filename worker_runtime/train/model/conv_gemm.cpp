// Conv2d as im2col + sgemm (see conv_gemm.hpp), one sample at a time: the sample's input is
// unrolled into cols [C*kh*kw][OH*OW] (row (c, ky, kx) holds x[c][oy+ky][ox+kx] over the output
// positions), so that
//   forward:  y_n [O][P]          = W [O][C*kh*kw] · cols
//   backward: dW  [O][C*kh*kw]   += dy_n [O][P] · colsᵀ
//             dcols [C*kh*kw][P]  = Wᵀ · dy_n, folded back onto dx_n (col2im)
// with P = OH*OW. Per sample, the convnet's conv2 is a 64 x 288 x 576 product: large enough for
// BLAS, and the scratch stays at one sample's columns (0.66 MB) per thread whatever the batch.
//
// Threads: with T conv threads (set_conv_threads), the batch is split into T contiguous ranges
// run side by side, each with single-threaded BLAS calls (OpenBLAS is set to 1 thread meanwhile,
// if it was not, and restored after), so that im2col, col2im and the bias sums run in parallel
// too and no BLAS call waits on another's pool. Each range after the first accumulates its
// weight and bias gradients in its own zeroed buffer, added in range order at the end: the
// result depends on T (the order of the sums), never on timing. On 2 cores this trains the
// convnet about 25% faster than per-sample calls on 2 OpenBLAS threads, whose idle thread spins
// (sched_yield) through every non-BLAS stretch.
#include "conv_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace ddp::train {

namespace {

std::atomic<int> g_conv_threads{1};

int as_int(std::size_t v) { return static_cast<int>(v); }

// Short rows (an output row: 24 to 26 floats in the convnet), in blocks of 8 the compiler turns
// into vector instructions (-O2 does not vectorise a loop of unknown length), without a call:
// GCC would otherwise see the copy idiom and call memcpy for each row (8% of the convnet's
// profile, most of it the call's own dispatch on rows this short).
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void copy_row(
    float* __restrict dst, const float* __restrict src, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) dst[i + j] = src[i + j];
  }
  for (; i < n; ++i) dst[i] = src[i];
}

// dst[0..n) = v, in blocks of 8 as copy_row (std::fill stays a scalar loop at -O2: one store a
// float over each sample's conv output).
void fill_row(float* __restrict dst, float v, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) dst[i + j] = v;
  }
  for (; i < n; ++i) dst[i] = v;
}

// dst += src, then src = 0: col2im leaves the column gradient zeroed for the next sample's
// product, which then accumulates onto it (beta 1) instead of OpenBLAS zeroing it in a pass of
// its own (beta 0 is a zeroing pass, then the same accumulation: the same bits).
void add_row_and_clear(float* __restrict dst, float* __restrict src, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) {
      dst[i + j] += src[i + j];
      src[i + j] = 0.0f;
    }
  }
  for (; i < n; ++i) {
    dst[i] += src[i];
    src[i] = 0.0f;
  }
}

// cols[(c*kh + ky)*kw + kx][oy*OW + ox] = x[c][oy + ky][ox + kx] for one sample.
void im2col(const float* x, float* cols, const kernels::Conv2dShape& s) {
  const std::size_t oh = s.out_h(), ow = s.out_w(), p = oh * ow;
  for (std::size_t c = 0; c < s.in_channels; ++c) {
    const float* xc = x + c * s.in_h * s.in_w;
    for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
      for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
        float* row = cols + ((c * s.kernel_h + ky) * s.kernel_w + kx) * p;
        for (std::size_t oy = 0; oy < oh; ++oy) {
          copy_row(row + oy * ow, xc + (oy + ky) * s.in_w + kx, ow);
        }
      }
    }
  }
}

// dx (one sample, overwritten) = the sum of the columns back onto the input positions; the
// columns are left zeroed.
void col2im(float* cols, float* dx, const kernels::Conv2dShape& s) {
  const std::size_t oh = s.out_h(), ow = s.out_w(), p = oh * ow;
  std::fill(dx, dx + s.in_channels * s.in_h * s.in_w, 0.0f);
  for (std::size_t c = 0; c < s.in_channels; ++c) {
    float* dxc = dx + c * s.in_h * s.in_w;
    for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
      for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
        float* row = cols + ((c * s.kernel_h + ky) * s.kernel_w + kx) * p;
        for (std::size_t oy = 0; oy < oh; ++oy) {
          add_row_and_clear(dxc + (oy + ky) * s.in_w + kx, row + oy * ow, ow);
        }
      }
    }
  }
}

// Runs part(t, first, last) for t in [0, parts) over [0, batch) cut into `parts` contiguous
// ranges: part 0 on this thread, the others on threads of their own, with OpenBLAS at one
// thread until all are done.
template <typename Part>
void split_batch(std::size_t batch, std::size_t parts, const Part& part) {
  if (parts <= 1) {
    part(std::size_t{0}, std::size_t{0}, batch);
    return;
  }
  const int blas_threads = openblas_get_num_threads();
  if (blas_threads != 1) openblas_set_num_threads(1);
  std::vector<std::thread> others;
  others.reserve(parts - 1);
  for (std::size_t t = 1; t < parts; ++t) {
    others.emplace_back(part, t, batch * t / parts, batch * (t + 1) / parts);
  }
  part(std::size_t{0}, std::size_t{0}, batch / parts);
  for (auto& th : others) th.join();
  if (blas_threads != 1) openblas_set_num_threads(blas_threads);
}

// The ranges a batch is cut into: one per conv thread, at most one per sample.
std::size_t parts_for(std::size_t batch) {
  return std::max<std::size_t>(1, std::min(batch, static_cast<std::size_t>(conv_threads())));
}

// One sample: y_n = bias + W · cols.
void forward_sample(const float* xn, const float* w, const float* b, float* yn, float* cols,
                    const kernels::Conv2dShape& s) {
  const std::size_t p = s.out_h() * s.out_w();
  const std::size_t kdim = s.in_channels * s.kernel_h * s.kernel_w;
  for (std::size_t o = 0; o < s.out_channels; ++o) {
    fill_row(yn + o * p, b != nullptr ? b[o] : 0.0f, p);
  }
  const float* cn = xn;
  if (s.kernel_h != 1 || s.kernel_w != 1) {  // a 1x1 kernel: the columns are x itself
    im2col(xn, cols, s);
    cn = cols;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, as_int(s.out_channels), as_int(p),
              as_int(kdim), 1.0f, w, as_int(kdim), cn, as_int(p), 1.0f, yn, as_int(p));
}

// The sum of n floats in 8 interleaved partial sums (the compiler vectorises them; one running
// sum would be a chain of dependent adds).
float row_sum(const float* r, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) acc[j] += r[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += r[i];
  for (float a : acc) sum += a;
  return sum;
}

// One sample: dw += dy_n · colsᵀ, db += the rows' sums, dx_n = col2im(Wᵀ · dy_n) unless dxn is
// null. cols and dcols: kdim x P floats each; dcols zero on entry, and left so.
void backward_sample(const float* dyn, const float* xn, const float* w, float* dxn, float* dw,
                     float* db, float* cols, float* dcols, const kernels::Conv2dShape& s) {
  const std::size_t p = s.out_h() * s.out_w();
  const std::size_t kdim = s.in_channels * s.kernel_h * s.kernel_w;
  const bool direct = s.kernel_h == 1 && s.kernel_w == 1;
  if (db != nullptr) {
    for (std::size_t o = 0; o < s.out_channels; ++o) db[o] += row_sum(dyn + o * p, p);
  }
  const float* cn = xn;
  if (!direct) {
    im2col(xn, cols, s);
    cn = cols;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, as_int(s.out_channels), as_int(kdim),
              as_int(p), 1.0f, dyn, as_int(p), cn, as_int(p), 1.0f, dw, as_int(kdim));
  if (dxn == nullptr) return;
  // dcols (zero) += Wᵀ · dy_n; a 1x1 kernel writes dx directly.
  float* out = direct ? dxn : dcols;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, as_int(kdim), as_int(p),
              as_int(s.out_channels), 1.0f, w, as_int(kdim), dyn, as_int(p), direct ? 0.0f : 1.0f,
              out, as_int(p));
  if (!direct) col2im(dcols, dxn, s);
}

}  // namespace

void parallel_ranges(std::size_t n, std::size_t min_per_range,
                     const std::function<void(std::size_t, std::size_t)>& fn) {
  const std::size_t most = n / std::max<std::size_t>(min_per_range, 1);
  const std::size_t parts =
      std::max<std::size_t>(1, std::min(most, static_cast<std::size_t>(conv_threads())));
  split_batch(n, parts, [&](std::size_t, std::size_t lo, std::size_t hi) { fn(lo, hi); });
}

void parallel_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  constexpr int kMinColumns = 64;
  const std::size_t parts =
      std::max<std::size_t>(1, std::min(static_cast<std::size_t>(n / kMinColumns),
                                        static_cast<std::size_t>(conv_threads())));
  const auto n_total = static_cast<std::size_t>(n);
  split_batch(n_total, parts, [&](std::size_t, std::size_t lo, std::size_t hi) {
    // Columns [lo, hi) of op(B): B's columns, or its rows when B is stored transposed.
    const float* bp = trans_b ? b + lo * static_cast<std::size_t>(ldb) : b + lo;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, as_int(hi - lo), k, alpha, a, lda, bp, ldb,
                beta, c + lo, ldc);
  });
}

void set_conv_threads(int n) { g_conv_threads.store(std::clamp(n, 1, kMaxConvThreads)); }
int conv_threads() { return g_conv_threads.load(); }

void conv2d_gemm_forward(const float* x, const float* w, const float* b, float* y,
                         const kernels::Conv2dShape& s, std::vector<float>& cols) {
  kernels::check_shape(s);
  const std::size_t per = s.in_channels * s.kernel_h * s.kernel_w * s.out_h() * s.out_w();
  const std::size_t x_step = s.in_channels * s.in_h * s.in_w;
  const std::size_t y_step = s.out_channels * s.out_h() * s.out_w();
  const std::size_t parts = parts_for(s.batch);
  if (cols.size() < parts * per) cols.resize(parts * per);
  float* scratch = cols.data();
  split_batch(s.batch, parts, [&](std::size_t t, std::size_t first, std::size_t last) {
    for (std::size_t n = first; n < last; ++n) {
      forward_sample(x + n * x_step, w, b, y + n * y_step, scratch + t * per, s);
    }
  });
}

void conv2d_gemm_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          float* db, const kernels::Conv2dShape& s, std::vector<float>& cols) {
  kernels::check_shape(s);
  const std::size_t per = s.in_channels * s.kernel_h * s.kernel_w * s.out_h() * s.out_w();
  const std::size_t x_step = s.in_channels * s.in_h * s.in_w;
  const std::size_t y_step = s.out_channels * s.out_h() * s.out_w();
  const std::size_t parts = parts_for(s.batch);
  // Each part: its columns and their gradient, then (parts after the first) its own weight and
  // bias gradient sums.
  const std::size_t grads = s.w_size() + s.out_channels;
  const std::size_t stride = 2 * per + grads;
  if (cols.size() < parts * stride) cols.resize(parts * stride);
  float* scratch = cols.data();
  split_batch(s.batch, parts, [&](std::size_t t, std::size_t first, std::size_t last) {
    float* mine = scratch + t * stride;
    float* gw = dw;
    float* gb = db;
    if (t > 0) {
      gw = mine + 2 * per;
      gb = db != nullptr ? gw + s.w_size() : nullptr;
      std::fill(gw, gw + grads, 0.0f);
    }
    if (dx != nullptr) fill_row(mine + per, 0.0f, per);  // the column gradient starts at zero
    for (std::size_t n = first; n < last; ++n) {
      backward_sample(dy + n * y_step, x + n * x_step, w, dx != nullptr ? dx + n * x_step : nullptr,
                      gw, gb, mine, mine + per, s);
    }
  });
  for (std::size_t t = 1; t < parts; ++t) {
    const float* gw = scratch + t * stride + 2 * per;
    for (std::size_t i = 0; i < s.w_size(); ++i) dw[i] += gw[i];
    if (db == nullptr) continue;
    for (std::size_t o = 0; o < s.out_channels; ++o) db[o] += gw[s.w_size() + o];
  }
}

}  // namespace ddp::train
