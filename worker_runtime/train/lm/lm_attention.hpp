// Causal attention on the CPU through BLAS: the fast path of the LM (lm_model.cpp). The plain
// loops of kernels::cpu::attention_forward/backward (lm_ref.hpp) are its reference and define the
// shapes; this computes the same thing as per-(sequence, head) GEMMs over row blocks, skipping the
// blocks above the causal diagonal.
#pragma once

#include <cstddef>

namespace ddp::train {

// q, k, v, out: [batch * seq][heads * head_dim]; att [batch][heads][seq][seq] receives the
// probabilities (zero above the diagonal), as kernels::cpu::attention_forward.
void attention_forward_blas(const float* q, const float* k, const float* v, float* att, float* out,
                            std::size_t batch, std::size_t seq, std::size_t heads,
                            std::size_t head_dim);

// dq, dk, dv (overwritten) from dout and the forward's att, as kernels::cpu::attention_backward.
void attention_backward_blas(const float* dout, const float* q, const float* k, const float* v,
                             const float* att, float* dq, float* dk, float* dv, std::size_t batch,
                             std::size_t seq, std::size_t heads, std::size_t head_dim);

}  // namespace ddp::train
