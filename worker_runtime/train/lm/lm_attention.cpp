// Causal attention through BLAS (lm_attention.hpp). Per sequence b and head h, with Q, K, V the
// head's [seq][head_dim] columns (leading dimension heads * head_dim) and P the probabilities:
//   forward:  S = scale Q K^T, P = softmax over j <= i, O = P V
//   backward: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)) scale, dQ = dS K, dK = dS^T Q
// Rows are cut into blocks of kBlock: the row block [r0, r1) only needs the key columns [0, r1)
// (and the column block [c0, c1) of dV, dK only the query rows [c0, seq)), so about half of the
// square is never computed.
#include "lm_attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lm_vec.hpp"

namespace ddp::train {

namespace {

constexpr std::size_t kBlock = 32;

int I(std::size_t n) { return static_cast<int>(n); }

void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
          const float* a, std::size_t lda, const float* b, std::size_t ldb, float* c,
          std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, I(m),
              I(n), I(k), alpha, a, I(lda), b, I(ldb), 0.0f, c, I(ldc));
}

}  // namespace

void attention_forward_blas(const float* q, const float* k, const float* v, float* att, float* out,
                            std::size_t batch, std::size_t seq, std::size_t heads,
                            std::size_t head_dim) {
  const std::size_t width = heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t at = b * seq * width + h * head_dim;
      float* p = att + (b * heads + h) * seq * seq;
      for (std::size_t r0 = 0; r0 < seq; r0 += kBlock) {
        const std::size_t r1 = std::min(seq, r0 + kBlock);
        gemm(false, true, r1 - r0, r1, head_dim, scale, q + at + r0 * width, width, k + at, width,
             p + r0 * seq, seq);
        for (std::size_t i = r0; i < r1; ++i) causal_softmax_row(p + i * seq, i, seq);
        gemm(false, false, r1 - r0, head_dim, r1, 1.0f, p + r0 * seq, seq, v + at, width,
             out + at + r0 * width, width);
      }
    }
  }
}

void attention_backward_blas(const float* dout, const float* q, const float* k, const float* v,
                             const float* att, float* dq, float* dk, float* dv, std::size_t batch,
                             std::size_t seq, std::size_t heads, std::size_t head_dim) {
  const std::size_t width = heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  thread_local std::vector<float> ds_buf;  // dS of one (sequence, head), zero above the diagonal
  if (ds_buf.size() < seq * seq) ds_buf.assign(seq * seq, 0.0f);
  float* ds = ds_buf.data();
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t at = b * seq * width + h * head_dim;
      const float* p = att + (b * heads + h) * seq * seq;
      for (std::size_t r0 = 0; r0 < seq; r0 += kBlock) {
        const std::size_t r1 = std::min(seq, r0 + kBlock);
        gemm(false, true, r1 - r0, r1, head_dim, 1.0f, dout + at + r0 * width, width, v + at, width,
             ds + r0 * seq, seq);  // dP
        for (std::size_t i = r0; i < r1; ++i) {
          const float* pi = p + i * seq;
          float* di = ds + i * seq;
          float row = 0.0f;
          for (std::size_t j = 0; j <= i; ++j) row += pi[j] * di[j];
          for (std::size_t j = 0; j <= i; ++j) di[j] = pi[j] * (di[j] - row) * scale;
          std::fill(di + i + 1, di + r1, 0.0f);
        }
        gemm(false, false, r1 - r0, head_dim, r1, 1.0f, ds + r0 * seq, seq, k + at, width,
             dq + at + r0 * width, width);
      }
      // Column block [c0, c1) of dV and dK: the query rows [c0, seq) see it.
      for (std::size_t c0 = 0; c0 < seq; c0 += kBlock) {
        const std::size_t c1 = std::min(seq, c0 + kBlock);
        gemm(true, false, c1 - c0, head_dim, seq - c0, 1.0f, p + c0 * seq + c0, seq,
             dout + at + c0 * width, width, dv + at + c0 * width, width);
        gemm(true, false, c1 - c0, head_dim, seq - c0, 1.0f, ds + c0 * seq + c0, seq,
             q + at + c0 * width, width, dk + at + c0 * width, width);
      }
    }
  }
}

}  // namespace ddp::train
