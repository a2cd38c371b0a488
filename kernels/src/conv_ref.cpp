// CPU references of the convnet layers (see conv_ref.hpp). Loops are ordered so the innermost
// one runs over contiguous output columns (the compiler vectorizes it); sums stay in float.
#include "ddp/kernels/conv_ref.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "ddp/proto/error.hpp"

namespace ddp::kernels {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) DDP_THROW(ConfigError, what);
}

}  // namespace

void check_shape(const Conv2dShape& s) {
  require(s.kernel_h > 0 && s.kernel_w > 0, "conv2d: the kernel is " + std::to_string(s.kernel_h) +
                                                "x" + std::to_string(s.kernel_w) +
                                                "; both sides must be at least 1");
  require(s.kernel_h <= s.in_h && s.kernel_w <= s.in_w,
          "conv2d: the kernel (" + std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w) +
              ") is larger than the input (" + std::to_string(s.in_h) + "x" +
              std::to_string(s.in_w) + ")");
}

void check_shape(const PoolShape& s) {
  require(s.k > 0, "max_pool2d: the window size is 0; it must be at least 1");
  require(s.k <= s.in_h && s.k <= s.in_w, "max_pool2d: the window (" + std::to_string(s.k) + "x" +
                                              std::to_string(s.k) + ") is larger than the input (" +
                                              std::to_string(s.in_h) + "x" +
                                              std::to_string(s.in_w) + ")");
}

std::uint32_t dropout_threshold(float p) {
  require(p >= 0.0f && p <= 1.0f,
          "dropout: the probability is " + std::to_string(p) + "; it must lie in [0, 1]");
  return static_cast<std::uint32_t>(std::llround(static_cast<double>(p) * 16777216.0));
}

float dropout_scale(float p) {
  if (p >= 1.0f) return 0.0f;
  return static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
}

}  // namespace ddp::kernels

namespace ddp::kernels::cpu {

void conv2d_forward(const float* x, const float* weight, const float* bias, float* y,
                    const Conv2dShape& s) {
  check_shape(s);
  const std::size_t oh = s.out_h(), ow = s.out_w(), kk = s.kernel_h * s.kernel_w;
  for (std::size_t n = 0; n < s.batch; ++n) {
    for (std::size_t o = 0; o < s.out_channels; ++o) {
      float* yp = y + (n * s.out_channels + o) * oh * ow;
      const float b = bias != nullptr ? bias[o] : 0.0f;
      for (std::size_t i = 0; i < oh * ow; ++i) yp[i] = b;
      for (std::size_t c = 0; c < s.in_channels; ++c) {
        const float* xp = x + (n * s.in_channels + c) * s.in_h * s.in_w;
        const float* wp = weight + (o * s.in_channels + c) * kk;
        for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
          for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
            const float wv = wp[ky * s.kernel_w + kx];
            for (std::size_t oy = 0; oy < oh; ++oy) {
              const float* xr = xp + (oy + ky) * s.in_w + kx;
              float* yr = yp + oy * ow;
              for (std::size_t ox = 0; ox < ow; ++ox) yr[ox] += wv * xr[ox];
            }
          }
        }
      }
    }
  }
}

void conv2d_backward_input(const float* dy, const float* weight, float* dx, const Conv2dShape& s) {
  check_shape(s);
  const std::size_t oh = s.out_h(), ow = s.out_w(), kk = s.kernel_h * s.kernel_w;
  std::memset(dx, 0, s.x_size() * sizeof(float));
  for (std::size_t n = 0; n < s.batch; ++n) {
    for (std::size_t c = 0; c < s.in_channels; ++c) {
      float* dxp = dx + (n * s.in_channels + c) * s.in_h * s.in_w;
      for (std::size_t o = 0; o < s.out_channels; ++o) {
        const float* dyp = dy + (n * s.out_channels + o) * oh * ow;
        const float* wp = weight + (o * s.in_channels + c) * kk;
        for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
          for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
            const float wv = wp[ky * s.kernel_w + kx];
            for (std::size_t oy = 0; oy < oh; ++oy) {
              float* dxr = dxp + (oy + ky) * s.in_w + kx;
              const float* dyr = dyp + oy * ow;
              for (std::size_t ox = 0; ox < ow; ++ox) dxr[ox] += wv * dyr[ox];
            }
          }
        }
      }
    }
  }
}

void conv2d_backward_weight(const float* dy, const float* x, float* dweight, const Conv2dShape& s) {
  check_shape(s);
  const std::size_t oh = s.out_h(), ow = s.out_w(), kk = s.kernel_h * s.kernel_w;
  for (std::size_t o = 0; o < s.out_channels; ++o) {
    for (std::size_t c = 0; c < s.in_channels; ++c) {
      float* dwp = dweight + (o * s.in_channels + c) * kk;
      for (std::size_t ky = 0; ky < s.kernel_h; ++ky) {
        for (std::size_t kx = 0; kx < s.kernel_w; ++kx) {
          float sum = 0.0f;
          for (std::size_t n = 0; n < s.batch; ++n) {
            const float* dyp = dy + (n * s.out_channels + o) * oh * ow;
            const float* xp = x + (n * s.in_channels + c) * s.in_h * s.in_w;
            for (std::size_t oy = 0; oy < oh; ++oy) {
              const float* xr = xp + (oy + ky) * s.in_w + kx;
              const float* dyr = dyp + oy * ow;
              for (std::size_t ox = 0; ox < ow; ++ox) sum += dyr[ox] * xr[ox];
            }
          }
          dwp[ky * s.kernel_w + kx] += sum;
        }
      }
    }
  }
}

void conv2d_backward_bias(const float* dy, float* dbias, const Conv2dShape& s) {
  check_shape(s);
  const std::size_t plane = s.out_h() * s.out_w();
  for (std::size_t o = 0; o < s.out_channels; ++o) {
    float sum = 0.0f;
    for (std::size_t n = 0; n < s.batch; ++n) {
      const float* dyp = dy + (n * s.out_channels + o) * plane;
      for (std::size_t i = 0; i < plane; ++i) sum += dyp[i];
    }
    dbias[o] += sum;
  }
}

void maxpool_forward(const float* x, float* y, std::int32_t* argmax, const PoolShape& s) {
  check_shape(s);
  const std::size_t oh = s.out_h(), ow = s.out_w();
  for (std::size_t p = 0; p < s.planes; ++p) {
    const float* xp = x + p * s.in_h * s.in_w;
    for (std::size_t oy = 0; oy < oh; ++oy) {
      for (std::size_t ox = 0; ox < ow; ++ox) {
        // PyTorch's loop: start at -inf with the window's first element, a NaN always wins.
        std::size_t best = oy * s.k * s.in_w + ox * s.k;
        float top = -INFINITY;
        for (std::size_t ky = 0; ky < s.k; ++ky) {
          for (std::size_t kx = 0; kx < s.k; ++kx) {
            const std::size_t at = (oy * s.k + ky) * s.in_w + ox * s.k + kx;
            if (xp[at] > top || std::isnan(xp[at])) {
              top = xp[at];
              best = at;
            }
          }
        }
        const std::size_t j = (p * oh + oy) * ow + ox;
        y[j] = top;
        argmax[j] = static_cast<std::int32_t>(best);
      }
    }
  }
}

void maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& s) {
  check_shape(s);
  const std::size_t plane_in = s.in_h * s.in_w, plane_out = s.out_h() * s.out_w();
  std::memset(dx, 0, s.x_size() * sizeof(float));
  for (std::size_t p = 0; p < s.planes; ++p) {
    for (std::size_t j = 0; j < plane_out; ++j) {
      const std::size_t at = p * plane_out + j;
      dx[p * plane_in + static_cast<std::size_t>(argmax[at])] += dy[at];
    }
  }
}

void dropout_forward(const float* x, float* y, std::uint8_t* mask, std::size_t n, float p,
                     std::uint64_t seed, std::uint64_t offset) {
  const std::uint32_t threshold = dropout_threshold(p);
  const float scale = dropout_scale(p);
  for (std::size_t i = 0; i < n; ++i) {
    const bool keep = dropout_bits(seed, offset + i) >= threshold;
    y[i] = keep ? x[i] * scale : 0.0f;
    if (mask != nullptr) mask[i] = static_cast<std::uint8_t>(keep);
  }
}

void dropout_backward(const float* dy, float* dx, std::size_t n, float p, std::uint64_t seed,
                      std::uint64_t offset) {
  dropout_forward(dy, dx, nullptr, n, p, seed, offset);
}

void adadelta_step(float* p, const float* g, float* sq, float* acc, std::size_t n, float lr,
                   float rho, float eps) {
  const float one_minus_rho = 1.0f - rho;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float sqi = sq[i] * rho + one_minus_rho * gi * gi;
    const float delta = std::sqrt(acc[i] + eps) / std::sqrt(sqi + eps) * gi;
    sq[i] = sqi;
    acc[i] = acc[i] * rho + one_minus_rho * delta * delta;
    p[i] -= lr * delta;
  }
}

}  // namespace ddp::kernels::cpu
