// Host launchers of the LLaMA-style transformer's CUDA kernels (issue 20), one op per file in
// kernels/src/cuda/ (embedding.cu, rmsnorm.cu, rope.cu, attention.cu, swiglu.cu, lm_xent.cu):
// each the GPU twin of a CPU reference in lm_ref.hpp, same layouts, tested against it
// (tests/gpu/lm_kernels_test.cpp). As in cuda_ops.hpp: device pointers, asynchronous on
// `stream`, launch errors throw ddp::CudaError, zero-sized calls launch nothing. Deterministic:
// no atomics; every sum is made by one thread or one warp or block in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/kernels/cuda_ops.hpp"

namespace ddp::kernels::cuda {

// out[r][:] = table[tokens[r]][:] (cpu::embedding_forward); tokens must be < the vocabulary.
void embedding_forward(const std::int32_t* tokens, const float* table, float* out, std::size_t rows,
                       std::size_t dim, Stream stream);
// dtable[tokens[r]][:] += dout[r][:] (cpu::embedding_backward): one block per vocabulary row
// scans the tokens and adds its rows in row order, so the result equals the CPU's bit for bit.
// Rows whose token is outside [0, vocab) are skipped.
void embedding_backward(const std::int32_t* tokens, const float* dout, float* dtable,
                        std::size_t rows, std::size_t dim, std::size_t vocab, Stream stream);

// RMSNorm, a warp per row (cpu::rmsnorm_forward): y and rstd [rows].
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::size_t rows,
                     std::size_t dim, float eps, Stream stream);
// dx overwritten (a warp per row) and dw accumulated (a thread per column over the rows in
// order) (cpu::rmsnorm_backward). dx must not alias dy or x.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, std::size_t rows, std::size_t dim, Stream stream);

// Rotary position embedding in place, a thread per pair (cpu::rope_forward); the angles in fp32
// as the reference computes them. An odd head_dim throws ddp::ConfigError before any launch.
void rope_forward(float* x, std::size_t rows, std::size_t seq, std::size_t heads,
                  std::size_t head_dim, float theta, Stream stream);
// The inverse rotation of dx, in place (cpu::rope_backward).
void rope_backward(float* dx, std::size_t rows, std::size_t seq, std::size_t heads,
                   std::size_t head_dim, float theta, Stream stream);

// Causal attention, a warp per (sequence, head, query) (cpu::attention_forward): att
// [batch][heads][seq][seq] gets the probabilities (zero above the diagonal), out the result.
void attention_forward(const float* q, const float* k, const float* v, float* att, float* out,
                       std::size_t batch, std::size_t seq, std::size_t heads, std::size_t head_dim,
                       Stream stream);
// dq, dk, dv overwritten (cpu::attention_backward), in three kernels: the per-query
// sum_j att*datt (parked in dq until the last kernel overwrites it), then dk and dv a warp per
// key, then dq a warp per query. dq, dk, dv must not alias the inputs or one another.
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* att, float* dq, float* dk, float* dv, std::size_t batch,
                        std::size_t seq, std::size_t heads, std::size_t head_dim, Stream stream);

// s = silu(g) * u, element-wise (cpu::swiglu_forward).
void swiglu_forward(const float* g, const float* u, float* s, std::size_t n, Stream stream);
// dg = ds * u * silu'(g), du = ds * silu(g), overwritten (cpu::swiglu_backward).
void swiglu_backward(const float* ds, const float* g, const float* u, float* dg, float* du,
                     std::size_t n, Stream stream);

// Language-model cross-entropy, forward and backward fused, a block per row, any vocabulary
// size (cpu::lm_cross_entropy sums what this leaves per row): loss_rows[r] = -log
// softmax(logits[r])[targets[r]]; dlogits (null: evaluation) = scale * (softmax - onehot).
void lm_cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                      float* loss_rows, std::size_t rows, std::size_t vocab, float scale,
                      Stream stream);

}  // namespace ddp::kernels::cuda
