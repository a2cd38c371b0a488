// The element-wise parts of ddp-train's LLaMA-style transformer on the CPU (issue 20): token
// embedding, RMSNorm, rotary position embeddings, causal attention, SwiGLU and the language-model
// cross-entropy, each forward and backward. The CPU engine (worker_runtime/train/lm/lm_model.cpp)
// uses them between its BLAS matrix products, and they are the references the CUDA kernels
// (lm_ops.hpp) are checked against. Row-major buffers; a "row" is one token of one sequence, so
// rows = batch * seq and the token at row r sits at position r % seq of its sequence. No
// allocation; every function may be called on a slice of whole sequences (a thread's share).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp::kernels::cpu {

// out[r][:] = table[tokens[r]][:] (table [vocab][dim]; tokens already checked < vocab).
void embedding_forward(const std::int32_t* tokens, const float* table, float* out, std::size_t rows,
                       std::size_t dim);
// dtable[tokens[r]][:] += dout[r][:], rows in order (so the sums' order is fixed).
void embedding_backward(const std::int32_t* tokens, const float* dout, float* dtable,
                        std::size_t rows, std::size_t dim);

// RMSNorm: rstd[r] = 1 / sqrt(mean_i x[r][i]^2 + eps); y[r][i] = x[r][i] * rstd[r] * w[i]
// (LLaMA's: the mean in fp32). rstd [rows] is kept for backward.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::size_t rows,
                     std::size_t dim, float eps);
// dx (overwritten) and dw (accumulated: dw[i] += sum_r dy[r][i] * x[r][i] * rstd[r]).
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, std::size_t rows, std::size_t dim);

// Rotary position embedding, in place, on x [rows][heads * head_dim] (queries or keys) with
// LLaMA's interleaved pairs: for the token at position p = r % seq, head h, pair j < head_dim/2,
// (a, b) = (x[r][h*head_dim + 2j], x[r][h*head_dim + 2j + 1]) becomes
// (a cos t - b sin t, a sin t + b cos t) with t = float(p) * freq_j and
// freq_j = 1 / theta^(2j / head_dim), computed in fp32 as torch's precompute_freqs_cis does.
// head_dim must be even.
void rope_forward(float* x, std::size_t rows, std::size_t seq, std::size_t heads,
                  std::size_t head_dim, float theta);
// The gradient through it: the inverse rotation (t -> -t) of dx, in place.
void rope_backward(float* dx, std::size_t rows, std::size_t seq, std::size_t heads,
                   std::size_t head_dim, float theta);

// Causal scaled dot-product attention of `batch` sequences of `seq` tokens: q, k, v, out are
// [batch * seq][heads * head_dim]; for each sequence and head, out = softmax(q k^T / sqrt(head_dim)
// + causal mask) v, where query position i sees key positions 0..i. att [batch][heads][seq][seq]
// receives the probabilities (zero above the diagonal), which backward needs.
void attention_forward(const float* q, const float* k, const float* v, float* att, float* out,
                       std::size_t batch, std::size_t seq, std::size_t heads, std::size_t head_dim);
// dq, dk, dv (overwritten, same shapes as q, k, v) from dout and the forward's att.
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* att, float* dq, float* dk, float* dv, std::size_t batch,
                        std::size_t seq, std::size_t heads, std::size_t head_dim);

// SwiGLU's gate: s[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)).
void swiglu_forward(const float* g, const float* u, float* s, std::size_t n);
// dg[i] = ds[i] * u[i] * silu'(g[i]); du[i] = ds[i] * silu(g[i]) (both overwritten; dg may be
// ds, in place).
void swiglu_backward(const float* ds, const float* g, const float* u, float* dg, float* du,
                     std::size_t n);

// Language-model cross-entropy over logits [rows][vocab] against targets [rows] (< vocab):
// returns the summed loss, sum_r -log softmax(logits[r])[targets[r]], in double; dlogits
// (may be null: evaluation) = scale * (softmax - onehot). Numerically stable (max subtracted).
double lm_cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                        std::size_t rows, std::size_t vocab, float scale);

}  // namespace ddp::kernels::cpu
