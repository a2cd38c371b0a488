// The dispatch of lm_vec.hpp: the loops of lm_vec_body.inc compiled for Skylake-AVX-512, for
// Haswell (AVX2 + FMA) and for the baseline, each in a namespace of its own, and the widest set
// this CPU runs picked once at the first call.
#include "lm_vec.hpp"

#include <cmath>
#include <cstdint>

namespace ddp::train {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DDP_VEC_X86 1
namespace vec_avx512 {
#pragma GCC push_options
#pragma GCC target("arch=skylake-avx512")
#include "lm_vec_body.inc"
#pragma GCC pop_options
}  // namespace vec_avx512
namespace vec_avx2 {
#pragma GCC push_options
#pragma GCC target("arch=haswell")
#include "lm_vec_body.inc"
#pragma GCC pop_options
}  // namespace vec_avx2
#endif
namespace vec_base {
#include "lm_vec_body.inc"
}  // namespace vec_base

namespace {

struct VecOps {
  decltype(&vec_base::exp_vec) exp;
  decltype(&vec_base::causal_softmax_row) softmax_row;
  decltype(&vec_base::swiglu_forward_vec) swiglu_forward;
  decltype(&vec_base::swiglu_backward_vec) swiglu_backward;
};

#define DDP_VEC_OPS(ns) \
  VecOps { ns::exp_vec, ns::causal_softmax_row, ns::swiglu_forward_vec, ns::swiglu_backward_vec }

// The widest set this CPU runs, chosen once.
const VecOps& ops() {
  static const VecOps chosen = [] {
#ifdef DDP_VEC_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
      return DDP_VEC_OPS(vec_avx512);
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return DDP_VEC_OPS(vec_avx2);
    }
#endif
    return DDP_VEC_OPS(vec_base);
  }();
  return chosen;
}

}  // namespace

void exp_vec(const float* x, float* y, std::size_t n) { ops().exp(x, y, n); }

void causal_softmax_row(float* s, std::size_t i, std::size_t seq) { ops().softmax_row(s, i, seq); }

void swiglu_forward_vec(const float* g, const float* u, float* s, std::size_t n) {
  ops().swiglu_forward(g, u, s, n);
}

void swiglu_backward_vec(const float* ds, const float* g, const float* u, float* dg, float* du,
                         std::size_t n) {
  ops().swiglu_backward(ds, g, u, dg, du, n);
}

}  // namespace ddp::train
