// Conv2d as im2col + sgemm (see conv_gemm.hpp), one sample at a time: the sample's input is
// unrolled into cols [C*kh*kw][OH*OW] (row (c, ky, kx) holds x[c][oy+ky][ox+kx] over the output
// positions), so that
//   forward:  y_n [O][P]          = W [O][C*kh*kw] · cols
//   backward: dW  [O][C*kh*kw]   += dy_n [O][P] · colsᵀ
//             dcols [C*kh*kw][P]  = Wᵀ · dy_n, folded back onto dx_n (col2im)
// with P = OH*OW. Per sample, the convnet's conv2 is a 64 x 288 x 576 product: large enough for
// BLAS, and the scratch stays at one sample's columns (0.66 MB) whatever the batch.
#include "conv_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>

namespace ddp::train {

namespace {

int as_int(std::size_t v) { return static_cast<int>(v); }

// cols[(c*kh + ky)*kw + kx][oy*OW + ox] = x[c][oy + ky][ox + kx] for one sample.
void im2col(const float* x, float* cols, const kernels::Conv2dShape& s) {
  const std::size_t oh = s.out_h(), ow = s.out_w(), p = oh * ow;
  for (std::size_t c = 0; c < s.in_channels; ++c) {
    const float* xc = x + c * s.in_h * s.in_w;
    for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
      for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
        float* row = cols + ((c * s.kernel_h + ky) * s.kernel_w + kx) * p;
        for (std::size_t oy = 0; oy < oh; ++oy) {
          std::memcpy(row + oy * ow, xc + (oy + ky) * s.in_w + kx, ow * sizeof(float));
        }
      }
    }
  }
}

// dx (one sample, overwritten) = the sum of the columns back onto the input positions.
void col2im(const float* cols, float* dx, const kernels::Conv2dShape& s) {
  const std::size_t oh = s.out_h(), ow = s.out_w(), p = oh * ow;
  std::fill(dx, dx + s.in_channels * s.in_h * s.in_w, 0.0f);
  for (std::size_t c = 0; c < s.in_channels; ++c) {
    float* dxc = dx + c * s.in_h * s.in_w;
    for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
      for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
        const float* row = cols + ((c * s.kernel_h + ky) * s.kernel_w + kx) * p;
        for (std::size_t oy = 0; oy < oh; ++oy) {
          const float* src = row + oy * ow;
          float* dst = dxc + (oy + ky) * s.in_w + kx;
          for (std::size_t ox = 0; ox < ow; ++ox) dst[ox] += src[ox];
        }
      }
    }
  }
}

}  // namespace

void conv2d_gemm_forward(const float* x, const float* w, const float* b, float* y,
                         const kernels::Conv2dShape& s, std::vector<float>& cols) {
  kernels::check_shape(s);
  const std::size_t p = s.out_h() * s.out_w();
  const std::size_t kdim = s.in_channels * s.kernel_h * s.kernel_w;
  const std::size_t x_step = s.in_channels * s.in_h * s.in_w, y_step = s.out_channels * p;
  const bool direct = s.kernel_h == 1 && s.kernel_w == 1;  // a 1x1 kernel: cols is x itself
  if (!direct && cols.size() < kdim * p) cols.resize(kdim * p);
  for (std::size_t n = 0; n < s.batch; ++n) {
    float* yn = y + n * y_step;
    // The bias first, then y += W · cols.
    for (std::size_t o = 0; o < s.out_channels; ++o) {
      std::fill(yn + o * p, yn + (o + 1) * p, b != nullptr ? b[o] : 0.0f);
    }
    const float* cn = x + n * x_step;
    if (!direct) {
      im2col(cn, cols.data(), s);
      cn = cols.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, as_int(s.out_channels), as_int(p),
                as_int(kdim), 1.0f, w, as_int(kdim), cn, as_int(p), 1.0f, yn, as_int(p));
  }
}

void conv2d_gemm_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                          float* db, const kernels::Conv2dShape& s, std::vector<float>& cols) {
  kernels::check_shape(s);
  const std::size_t p = s.out_h() * s.out_w();
  const std::size_t kdim = s.in_channels * s.kernel_h * s.kernel_w;
  const std::size_t x_step = s.in_channels * s.in_h * s.in_w, y_step = s.out_channels * p;
  const bool direct = s.kernel_h == 1 && s.kernel_w == 1;
  // cols: the sample's columns (for dW), then the columns' gradient (for dx).
  const std::size_t need = (direct ? 0 : kdim * p) + (dx != nullptr ? kdim * p : 0);
  if (cols.size() < need) cols.resize(need);
  float* dcols = cols.data() + (direct ? 0 : kdim * p);
  for (std::size_t n = 0; n < s.batch; ++n) {
    const float* dyn = dy + n * y_step;
    if (db != nullptr) {
      for (std::size_t o = 0; o < s.out_channels; ++o) {
        const float* r = dyn + o * p;
        float sum = 0.0f;
        for (std::size_t i = 0; i < p; ++i) sum += r[i];
        db[o] += sum;
      }
    }
    const float* cn = x + n * x_step;
    if (!direct) {
      im2col(cn, cols.data(), s);
      cn = cols.data();
    }
    // dW += dy_n · colsᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, as_int(s.out_channels), as_int(kdim),
                as_int(p), 1.0f, dyn, as_int(p), cn, as_int(p), 1.0f, dw, as_int(kdim));
    if (dx == nullptr) continue;
    float* dxn = dx + n * x_step;
    // dcols = Wᵀ · dy_n; a 1x1 kernel writes dx directly.
    float* out = direct ? dxn : dcols;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, as_int(kdim), as_int(p),
                as_int(s.out_channels), 1.0f, w, as_int(kdim), dyn, as_int(p), 0.0f, out,
                as_int(p));
    if (!direct) col2im(dcols, dxn, s);
  }
}

}  // namespace ddp::train
