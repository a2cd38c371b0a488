// CPU references of the transformer's element-wise operations (see lm_ref.hpp): plain loops over
// rows with the innermost loop running along a contiguous row, sums kept in float as PyTorch's
// fp32 LLaMA does (only the cross-entropy's total is a double). Attention walks each sequence and
// head query by query over the keys it may see; its backward keeps one row of dP in a
// thread-local buffer that grows once per thread, so no call allocates in the steady state.
#include "ddp/kernels/lm_ref.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace ddp::kernels::cpu {

namespace {

float dot(const float* a, const float* b, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] += alpha * x[i]
void axpy(float alpha, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Rotates every (head, pair) of each row by +t (sign = 1) or -t (sign = -1). The angle of pair j
// at position p is float(p) * freq_j with freq_j = 1 / theta^(float(2j) / float(head_dim)), all in
// fp32 as llama's precompute_freqs_cis; cos and sin are taken once per (row, pair) for all heads.
void rope_rotate(float* x, std::size_t rows, std::size_t seq, std::size_t heads,
                 std::size_t head_dim, float theta, float sign) {
  const std::size_t pairs = head_dim / 2;
  const std::size_t width = heads * head_dim;
  for (std::size_t r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(r % seq);
    float* row = x + r * width;
    for (std::size_t j = 0; j < pairs; ++j) {
      const float expo = static_cast<float>(2 * j) / static_cast<float>(head_dim);
      const float freq = 1.0f / std::pow(theta, expo);
      const float angle = pos * freq;
      const float c = std::cos(angle);
      const float s = sign * std::sin(angle);
      for (std::size_t h = 0; h < heads; ++h) {
        float* pr = row + h * head_dim + 2 * j;
        const float a = pr[0], b = pr[1];
        pr[0] = a * c - b * s;
        pr[1] = a * s + b * c;
      }
    }
  }
}

}  // namespace

void embedding_forward(const std::int32_t* tokens, const float* table, float* out, std::size_t rows,
                       std::size_t dim) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* src = table + static_cast<std::size_t>(tokens[r]) * dim;
    std::memcpy(out + r * dim, src, dim * sizeof(float));
  }
}

void embedding_backward(const std::int32_t* tokens, const float* dout, float* dtable,
                        std::size_t rows, std::size_t dim) {
  for (std::size_t r = 0; r < rows; ++r) {
    float* dst = dtable + static_cast<std::size_t>(tokens[r]) * dim;
    const float* src = dout + r * dim;
    for (std::size_t i = 0; i < dim; ++i) dst[i] += src[i];
  }
}

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::size_t rows,
                     std::size_t dim, float eps) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float mean = dot(xr, xr, dim) / static_cast<float>(dim);
    const float s = 1.0f / std::sqrt(mean + eps);
    rstd[r] = s;
    for (std::size_t i = 0; i < dim; ++i) yr[i] = (xr[i] * s) * w[i];
  }
}

// With m = mean x^2 and s = (m + eps)^-1/2: ds/dx_k = -s^3 x_k / dim, so
// dx_k = s * (dy_k w_k - x_k * s^2 * (sum_i dy_i w_i x_i) / dim).
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, std::size_t rows, std::size_t dim) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * dim;
    const float* xr = x + r * dim;
    float* dxr = dx + r * dim;
    const float s = rstd[r];
    float proj = 0.0f;
    for (std::size_t i = 0; i < dim; ++i) proj += dyr[i] * w[i] * xr[i];
    const float k = s * s * proj / static_cast<float>(dim);
    for (std::size_t i = 0; i < dim; ++i) {
      dxr[i] = s * (dyr[i] * w[i] - xr[i] * k);
      dw[i] += dyr[i] * xr[i] * s;
    }
  }
}

void rope_forward(float* x, std::size_t rows, std::size_t seq, std::size_t heads,
                  std::size_t head_dim, float theta) {
  rope_rotate(x, rows, seq, heads, head_dim, theta, 1.0f);
}

void rope_backward(float* dx, std::size_t rows, std::size_t seq, std::size_t heads,
                   std::size_t head_dim, float theta) {
  rope_rotate(dx, rows, seq, heads, head_dim, theta, -1.0f);
}

void attention_forward(const float* q, const float* k, const float* v, float* att, float* out,
                       std::size_t batch, std::size_t seq, std::size_t heads,
                       std::size_t head_dim) {
  const std::size_t width = heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t row0 = b * seq;
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t col = h * head_dim;
      float* att_bh = att + (b * heads + h) * seq * seq;
      for (std::size_t i = 0; i < seq; ++i) {
        const float* qi = q + (row0 + i) * width + col;
        float* p = att_bh + i * seq;
        float pmax = -INFINITY;
        for (std::size_t j = 0; j <= i; ++j) {
          p[j] = dot(qi, k + (row0 + j) * width + col, head_dim) * scale;
          pmax = std::max(pmax, p[j]);
        }
        float sum = 0.0f;
        for (std::size_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - pmax);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (std::size_t j = 0; j <= i; ++j) p[j] *= inv;
        std::fill(p + i + 1, p + seq, 0.0f);

        float* oi = out + (row0 + i) * width + col;
        std::fill(oi, oi + head_dim, 0.0f);
        for (std::size_t j = 0; j <= i; ++j) axpy(p[j], v + (row0 + j) * width + col, oi, head_dim);
      }
    }
  }
}

// Per query i (S = scaled scores, P = att): dV_j += P_ij dO_i; dP_ij = dO_i . V_j;
// dS_ij = P_ij (dP_ij - sum_l P_il dP_il); dQ_i += scale dS_ij K_j; dK_j += scale dS_ij Q_i.
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* att, float* dq, float* dk, float* dv, std::size_t batch,
                        std::size_t seq, std::size_t heads, std::size_t head_dim) {
  const std::size_t width = heads * head_dim;
  const std::size_t n = batch * seq * width;
  std::fill(dq, dq + n, 0.0f);
  std::fill(dk, dk + n, 0.0f);
  std::fill(dv, dv + n, 0.0f);
  thread_local std::vector<float> dp_row;
  if (dp_row.size() < seq) dp_row.resize(seq);
  float* dp = dp_row.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t row0 = b * seq;
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t col = h * head_dim;
      const float* att_bh = att + (b * heads + h) * seq * seq;
      for (std::size_t i = 0; i < seq; ++i) {
        const std::size_t at_i = (row0 + i) * width + col;
        const float* p = att_bh + i * seq;
        const float* doi = dout + at_i;
        float row_dot = 0.0f;
        for (std::size_t j = 0; j <= i; ++j) {
          const std::size_t at_j = (row0 + j) * width + col;
          dp[j] = dot(doi, v + at_j, head_dim);
          row_dot += p[j] * dp[j];
          axpy(p[j], doi, dv + at_j, head_dim);
        }
        const float* qi = q + at_i;
        float* dqi = dq + at_i;
        for (std::size_t j = 0; j <= i; ++j) {
          const std::size_t at_j = (row0 + j) * width + col;
          const float ds = p[j] * (dp[j] - row_dot) * scale;
          axpy(ds, k + at_j, dqi, head_dim);
          axpy(ds, qi, dk + at_j, head_dim);
        }
      }
    }
  }
}

void swiglu_forward(const float* g, const float* u, float* s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) s[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// silu'(x) = sig(x) * (1 + x * (1 - sig(x))).
void swiglu_backward(const float* ds, const float* g, const float* u, float* dg, float* du,
                     std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    const float silu = g[i] * sig;
    const float d = ds[i];  // read once: dg may be ds (in place)
    dg[i] = d * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    du[i] = d * silu;
  }
}

// Per row: e_c = exp(z_c - max) in float, summed in double; the loss is log(sum) - (z_t - max).
// dlogits holds e_c after the first pass and is scaled to scale * (e_c / sum - onehot) in place.
double lm_cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                        std::size_t rows, std::size_t vocab, float scale) {
  double total = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * vocab;
    const float zmax = *std::max_element(z, z + vocab);
    const auto t = static_cast<std::size_t>(targets[r]);
    double sum = 0.0;
    if (dlogits == nullptr) {
      for (std::size_t c = 0; c < vocab; ++c) sum += static_cast<double>(std::exp(z[c] - zmax));
    } else {
      float* dz = dlogits + r * vocab;
      for (std::size_t c = 0; c < vocab; ++c) {
        dz[c] = std::exp(z[c] - zmax);
        sum += static_cast<double>(dz[c]);
      }
      const auto factor = static_cast<float>(static_cast<double>(scale) / sum);
      for (std::size_t c = 0; c < vocab; ++c) dz[c] *= factor;
      dz[t] -= scale;
    }
    total += std::log(sum) - static_cast<double>(z[t] - zmax);
  }
  return total;
}

}  // namespace ddp::kernels::cpu
