// The LM's element-wise hot loops on the CPU path, written for the vectorizer: the softmax row of
// causal attention and SwiGLU forward and backward, with exp computed by range reduction and a
// polynomial instead of a libm call, and compiled at -O3 for AVX-512, AVX2 + FMA and the baseline
// (GCC's target_clones picks one at load). kernels::cpu (lm_ref.hpp) is their reference; the
// exp here is within 2 float ulps of std::exp over the range softmax and SwiGLU see.
#pragma once

#include <cstddef>

namespace ddp::train {

// exp(x[i]) for i < n into y (y may be x).
void exp_vec(const float* x, float* y, std::size_t n);

// s[0..i] becomes softmax(s[0..i]); s[i+1..seq) becomes 0.
void causal_softmax_row(float* s, std::size_t i, std::size_t seq);

// As kernels::cpu::swiglu_forward / swiglu_backward (dg may be ds).
void swiglu_forward_vec(const float* g, const float* u, float* s, std::size_t n);
void swiglu_backward_vec(const float* ds, const float* g, const float* u, float* dg, float* du,
                         std::size_t n);

}  // namespace ddp::train
