// The BLAS attention of the LM (lm_attention.hpp) against its reference, the plain loops of
// kernels::cpu::attention_* (lm_ref.hpp, itself checked against finite differences): forward
// output and probabilities, and all three gradients, at sequence lengths below, on and across the
// row-block edge, with outputs pre-filled with garbage (everything must be overwritten); and the
// vectorized exp and SwiGLU (lm_vec.hpp) against std::exp and the SwiGLU reference.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <vector>

#include "support/random_floats.hpp"
#include "ddp/kernels/lm_ref.hpp"
#include "lm_attention.hpp"
#include "lm_vec.hpp"

namespace {

// max |a - b| / (1 + |b|)
double worst(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    w = std::max(w, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(b[i]))));
  }
  return w;
}

}  // namespace

TEST_CASE("lm BLAS attention equals the reference loops, forward and backward", "[lm_attention]") {
  const std::size_t heads = 3, hd = 8;
  const std::size_t seqs[] = {1, 7, 32, 33, 70};
  for (const std::size_t seq : seqs) {
    for (const std::size_t batch : {std::size_t{1}, std::size_t{2}}) {
      CAPTURE(seq, batch);
      const std::size_t n = batch * seq * heads * hd, na = batch * heads * seq * seq;
      const auto seed = static_cast<unsigned>(seq * 10 + batch);
      auto q = random_floats(n, seed), k = random_floats(n, seed + 1),
           v = random_floats(n, seed + 2);
      auto dout = random_floats(n, seed + 3);
      std::vector<float> att_r(na), out_r(n), att_b(na, 7.0f), out_b(n, 7.0f);
      ddp::kernels::cpu::attention_forward(q.data(), k.data(), v.data(), att_r.data(), out_r.data(),
                                           batch, seq, heads, hd);
      ddp::train::attention_forward_blas(q.data(), k.data(), v.data(), att_b.data(), out_b.data(),
                                         batch, seq, heads, hd);
      CHECK(worst(att_b, att_r) < 1e-6);
      CHECK(worst(out_b, out_r) < 1e-5);

      std::vector<float> dq_r(n), dk_r(n), dv_r(n), dq_b(n, 7.0f), dk_b(n, 7.0f), dv_b(n, 7.0f);
      ddp::kernels::cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), att_r.data(),
                                            dq_r.data(), dk_r.data(), dv_r.data(), batch, seq,
                                            heads, hd);
      ddp::train::attention_backward_blas(dout.data(), q.data(), k.data(), v.data(), att_r.data(),
                                          dq_b.data(), dk_b.data(), dv_b.data(), batch, seq, heads,
                                          hd);
      CHECK(worst(dq_b, dq_r) < 1e-5);
      CHECK(worst(dk_b, dk_r) < 1e-5);
      CHECK(worst(dv_b, dv_r) < 1e-5);
    }
  }
}

TEST_CASE("lm vector exp is within 2 ulps of std::exp and SwiGLU matches its reference",
          "[lm_attention]") {
  std::vector<float> x;
  for (float v = -87.0f; v < 88.7f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f}) x.push_back(v);
  std::vector<float> y(x.size());
  ddp::train::exp_vec(x.data(), y.data(), x.size());
  double worst_ulps = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    const double ulp = double(std::nextafter(want, INFINITY)) - want;
    worst_ulps = std::max(worst_ulps, std::fabs(double(y[i]) - want) / ulp);
  }
  CAPTURE(worst_ulps);
  CHECK(worst_ulps <= 2.0);
  float huge[] = {-1000.0f, 1000.0f, -INFINITY}, out[3];
  ddp::train::exp_vec(huge, out, 3);
  CHECK(out[0] <= 1.3e-38f);
  CHECK(out[0] >= 0.0f);
  CHECK(out[1] > 3e38f);
  CHECK(std::isfinite(out[1]));
  CHECK(out[2] <= 1.3e-38f);

  const std::size_t n = 1003;  // not a multiple of any vector width
  const auto g = random_floats(n, 5), u = random_floats(n, 6), ds = random_floats(n, 7);
  std::vector<float> g8(g);
  for (auto& v : g8) v *= 8.0f;  // silu's tails
  std::vector<float> s_r(n), s_v(n), dg_r(n), du_r(n), dg_v(n), du_v(n);
  ddp::kernels::cpu::swiglu_forward(g8.data(), u.data(), s_r.data(), n);
  ddp::train::swiglu_forward_vec(g8.data(), u.data(), s_v.data(), n);
  CHECK(worst(s_v, s_r) < 1e-6);
  ddp::kernels::cpu::swiglu_backward(ds.data(), g8.data(), u.data(), dg_r.data(), du_r.data(), n);
  ddp::train::swiglu_backward_vec(ds.data(), g8.data(), u.data(), dg_v.data(), du_v.data(), n);
  CHECK(worst(dg_v, dg_r) < 1e-6);
  CHECK(worst(du_v, du_r) < 1e-6);
  std::vector<float> inplace(ds);  // dg = ds, in place
  ddp::train::swiglu_backward_vec(inplace.data(), g8.data(), u.data(), inplace.data(), du_v.data(),
                                  n);
  CHECK(worst(inplace, dg_r) < 1e-6);
}
