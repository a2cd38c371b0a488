// The transformer's CPU references (lm_ref.hpp): each forward against a direct re-computation in
// double, each backward against central differences of L = sum(forward * R) taken on that double
// re-computation (rope, being linear, against its adjoint), plus the properties the model leans
// on: rope's rotation keeps pair norms and leaves position 0 alone, attention is causal and its
// probability rows sum to 1, the cross-entropy is stable, embedding gradients accumulate, and
// every op run on a slice of whole sequences gives exactly the whole batch's rows.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "support/random_floats.hpp"
#include "ddp/kernels/lm_ref.hpp"

namespace cpu = ddp::kernels::cpu;
using Vec = std::vector<double>;

namespace {

Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// |a - b| <= abs + rel * |b| everywhere, naming the first index that is not.
bool near(const std::vector<float>& a, const Vec& b, double rel, double abs) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - b[i]) <= abs + rel * std::abs(b[i]))) {
      UNSCOPED_INFO("index " << i << ": got " << a[i] << ", expected " << b[i]);
      return false;
    }
  }
  return true;
}

bool same(const float* a, const float* b, std::size_t n) { return std::equal(a, a + n, b); }

// Central differences of f (double in, double out) at x, one element at a time.
template <class F>
Vec numeric_grad(Vec x, F f) {
  const double h = 1e-6;
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

std::vector<std::int32_t> random_tokens(std::size_t n, std::size_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % vocab);
  return t;
}

Vec ref_rmsnorm(const Vec& x, const Vec& w, std::size_t rows, std::size_t dim, double eps,
                Vec* rstd = nullptr) {
  Vec y(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (std::size_t i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    if (rstd) rstd->push_back(s);
    for (std::size_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * s * w[i];
  }
  return y;
}

// The angle in fp32 exactly as llama's precompute_freqs_cis; the rotation itself in double.
Vec ref_rope(Vec x, std::size_t seq, std::size_t heads, std::size_t hd, float theta) {
  const std::size_t rows = x.size() / (heads * hd);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t j = 0; j < hd / 2; ++j) {
        const float freq =
            1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(hd));
        const double t = static_cast<float>(r % seq) * freq;
        double* p = &x[(r * heads + h) * hd + 2 * j];
        const double a = p[0], b = p[1];
        p[0] = a * std::cos(t) - b * std::sin(t);
        p[1] = a * std::sin(t) + b * std::cos(t);
      }
  return x;
}

struct AttnShape {
  std::size_t batch, seq, heads, hd;
  std::size_t n() const { return batch * seq * heads * hd; }
  std::size_t att() const { return batch * heads * seq * seq; }
};

Vec ref_attention(const Vec& q, const Vec& k, const Vec& v, const AttnShape& s,
                  Vec* att = nullptr) {
  const std::size_t width = s.heads * s.hd;
  Vec out(s.n(), 0.0), p(s.seq);
  if (att) att->assign(s.att(), 0.0);
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t h = 0; h < s.heads; ++h)
      for (std::size_t i = 0; i < s.seq; ++i) {
        auto at = [&](std::size_t pos, std::size_t d) {
          return (b * s.seq + pos) * width + h * s.hd + d;
        };
        double sum = 0.0;
        for (std::size_t j = 0; j <= i; ++j) {
          double sc = 0.0;
          for (std::size_t d = 0; d < s.hd; ++d) sc += q[at(i, d)] * k[at(j, d)];
          p[j] = std::exp(sc / std::sqrt(static_cast<double>(s.hd)));
          sum += p[j];
        }
        for (std::size_t j = 0; j <= i; ++j) {
          if (att) (*att)[((b * s.heads + h) * s.seq + i) * s.seq + j] = p[j] / sum;
          for (std::size_t d = 0; d < s.hd; ++d) out[at(i, d)] += p[j] / sum * v[at(j, d)];
        }
      }
  return out;
}

Vec ref_swiglu(const Vec& g, const Vec& u) {
  Vec s(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) s[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return s;
}

double ref_xent(const Vec& z, const std::vector<std::int32_t>& t, std::size_t vocab) {
  double total = 0.0;
  for (std::size_t r = 0; r < t.size(); ++r) {
    double sum = 0.0;
    for (std::size_t c = 0; c < vocab; ++c) sum += std::exp(z[r * vocab + c]);
    total += std::log(sum) - z[r * vocab + static_cast<std::size_t>(t[r])];
  }
  return total;
}

}  // namespace

TEST_CASE("lm embedding copies table rows and its backward accumulates repeated tokens",
          "[lm_ref]") {
  const std::size_t vocab = 5, dim = 3;
  const std::vector<std::int32_t> tokens = {2, 0, 2, 4, 2};
  const auto table = random_floats(vocab * dim, 1), dout = random_floats(tokens.size() * dim, 2);
  std::vector<float> out(tokens.size() * dim, 99.0f);
  cpu::embedding_forward(tokens.data(), table.data(), out.data(), tokens.size(), dim);
  for (std::size_t r = 0; r < tokens.size(); ++r)
    CHECK(same(&out[r * dim], &table[static_cast<std::size_t>(tokens[r]) * dim], dim));

  auto dtable = random_floats(vocab * dim, 3);
  auto expect = dtable;  // the same additions in the same order: exact
  for (std::size_t r = 0; r < tokens.size(); ++r)
    for (std::size_t i = 0; i < dim; ++i)
      expect[static_cast<std::size_t>(tokens[r]) * dim + i] += dout[r * dim + i];
  cpu::embedding_backward(tokens.data(), dout.data(), dtable.data(), tokens.size(), dim);
  CHECK(dtable == expect);
  CHECK(dtable[2 * dim] != random_floats(vocab * dim, 3)[2 * dim]);  // token 2, three times
  CHECK(dtable[1 * dim] == random_floats(vocab * dim, 3)[1 * dim]);  // token 1 never appears
}

TEST_CASE("lm rmsnorm forward matches the formula and backward matches finite differences",
          "[lm_ref]") {
  const std::size_t rows = 6, dim = 7;
  const float eps = 1e-5f;
  const auto x = random_floats(rows * dim, 4), w = random_floats(dim, 5);
  const auto r = random_floats(rows * dim, 6), dw0 = random_floats(dim, 7);
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim, 99.0f);
  cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, eps);
  Vec want_rstd;
  CHECK(near(y, ref_rmsnorm(to_double(x), to_double(w), rows, dim, eps, &want_rstd), 1e-5, 1e-6));
  CHECK(near(rstd, want_rstd, 1e-5, 0.0));

  auto dw = dw0;
  cpu::rmsnorm_backward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, dim);
  const Vec xd = to_double(x), wd = to_double(w), rd = to_double(r);
  const Vec fd_x =
      numeric_grad(xd, [&](const Vec& v) { return dot(ref_rmsnorm(v, wd, rows, dim, eps), rd); });
  Vec fd_w =
      numeric_grad(wd, [&](const Vec& v) { return dot(ref_rmsnorm(xd, v, rows, dim, eps), rd); });
  for (std::size_t i = 0; i < dim; ++i) fd_w[i] += dw0[i];  // dw accumulates
  CHECK(near(dx, fd_x, 1e-3, 1e-4));
  CHECK(near(dw, fd_w, 1e-3, 1e-4));
}

TEST_CASE("lm rope rotates interleaved pairs by position times an fp32 frequency", "[lm_ref]") {
  const std::size_t seq = 5, heads = 3, hd = 6, rows = 2 * seq, n = rows * heads * hd;
  const float theta = 10000.0f;
  const auto x = random_floats(n, 8);
  auto y = x;
  cpu::rope_forward(y.data(), rows, seq, heads, hd, theta);
  CHECK(near(y, ref_rope(to_double(x), seq, heads, hd, theta), 1e-5, 1e-6));
  for (std::size_t i = 0; i < n; i += 2) {
    const double before = std::hypot(x[i], x[i + 1]), after = std::hypot(y[i], y[i + 1]);
    CHECK(after == Approx(before).epsilon(1e-6));
  }
  for (std::size_t b = 0; b < 2; ++b)  // position 0 of each sequence: the identity
    CHECK(same(&y[b * seq * heads * hd], &x[b * seq * heads * hd], heads * hd));

  // Worked by hand: position 3, head_dim 4, theta 10000: freqs 1 and 1/100.
  std::vector<float> e(4 * 4, 0.0f);
  for (std::size_t p = 0; p < 4; ++p) e[p * 4] = e[p * 4 + 2] = 1.0f;
  cpu::rope_forward(e.data(), 4, 4, 1, 4, theta);
  const double hand[4] = {std::cos(3.0), std::sin(3.0), std::cos(0.03), std::sin(0.03)};
  for (std::size_t i = 0; i < 4; ++i) CHECK(e[12 + i] == Approx(hand[i]).margin(1e-6));

  // Backward is the inverse rotation, hence also the adjoint: <rope(x), R> = <x, rope^T(R)>.
  auto back = y;
  cpu::rope_backward(back.data(), rows, seq, heads, hd, theta);
  CHECK(near(back, to_double(x), 0.0, 1e-6));
  auto r = random_floats(n, 9);
  const double lhs = dot(to_double(y), to_double(r));
  cpu::rope_backward(r.data(), rows, seq, heads, hd, theta);
  CHECK(dot(to_double(x), to_double(r)) == Approx(lhs).epsilon(1e-5));
}

TEST_CASE("lm attention forward matches the formula, is causal, rows of att sum to 1", "[lm_ref]") {
  const AttnShape s{2, 5, 2, 4};
  const std::size_t width = s.heads * s.hd;
  auto q = random_floats(s.n(), 10), k = random_floats(s.n(), 11), v = random_floats(s.n(), 12);
  std::vector<float> att(s.att(), 99.0f), out(s.n(), 99.0f);
  cpu::attention_forward(q.data(), k.data(), v.data(), att.data(), out.data(), s.batch, s.seq,
                         s.heads, s.hd);
  Vec want_att;
  CHECK(
      near(out, ref_attention(to_double(q), to_double(k), to_double(v), s, &want_att), 1e-5, 1e-6));
  CHECK(near(att, want_att, 1e-5, 1e-7));
  for (std::size_t row = 0; row < s.batch * s.heads * s.seq; ++row) {
    const std::size_t i = row % s.seq;
    double sum = 0.0;
    for (std::size_t j = 0; j < s.seq; ++j) {
      sum += att[row * s.seq + j];
      if (j > i) CHECK(att[row * s.seq + j] == 0.0f);
    }
    CHECK(sum == Approx(1.0).epsilon(1e-6));
  }
  CHECK(same(&out[0], &v[0], width));  // position 0 sees only itself

  // Changing sequence 0's key and value at position 3 leaves its positions 0-2 and sequence 1.
  const auto before = out;
  for (std::size_t c = 0; c < width; ++c) k[3 * width + c] += 0.5f, v[3 * width + c] -= 0.5f;
  cpu::attention_forward(q.data(), k.data(), v.data(), att.data(), out.data(), s.batch, s.seq,
                         s.heads, s.hd);
  CHECK(same(out.data(), before.data(), 3 * width));
  CHECK_FALSE(same(&out[3 * width], &before[3 * width], width));
  CHECK_FALSE(same(&out[4 * width], &before[4 * width], width));
  CHECK(same(&out[s.seq * width], &before[s.seq * width], s.seq * width));

  // Scores far past fp32's exp range (q times 300) still work: the row maximum is subtracted.
  for (auto& x : q) x *= 300.0f;
  cpu::attention_forward(q.data(), k.data(), v.data(), att.data(), out.data(), s.batch, s.seq,
                         s.heads, s.hd);
  CHECK(near(out, ref_attention(to_double(q), to_double(k), to_double(v), s), 1e-3, 1e-4));
}

TEST_CASE("lm attention backward matches finite differences for q, k and v", "[lm_ref]") {
  const AttnShape s{2, 5, 2, 4};
  const auto q = random_floats(s.n(), 13), k = random_floats(s.n(), 14);
  const auto v = random_floats(s.n(), 15), r = random_floats(s.n(), 16);
  std::vector<float> att(s.att()), out(s.n());
  std::vector<float> dq(s.n(), 99.0f), dk(s.n(), 99.0f), dv(s.n(), 99.0f);
  cpu::attention_forward(q.data(), k.data(), v.data(), att.data(), out.data(), s.batch, s.seq,
                         s.heads, s.hd);
  cpu::attention_backward(r.data(), q.data(), k.data(), v.data(), att.data(), dq.data(), dk.data(),
                          dv.data(), s.batch, s.seq, s.heads, s.hd);
  const Vec qd = to_double(q), kd = to_double(k), vd = to_double(v), rd = to_double(r);
  CHECK(near(dq,
             numeric_grad(qd, [&](const Vec& x) { return dot(ref_attention(x, kd, vd, s), rd); }),
             1e-3, 1e-4));
  CHECK(near(dk,
             numeric_grad(kd, [&](const Vec& x) { return dot(ref_attention(qd, x, vd, s), rd); }),
             1e-3, 1e-4));
  CHECK(near(dv,
             numeric_grad(vd, [&](const Vec& x) { return dot(ref_attention(qd, kd, x, s), rd); }),
             1e-3, 1e-4));
}

TEST_CASE("lm swiglu forward matches silu(g) * u and backward matches finite differences",
          "[lm_ref]") {
  const std::size_t n = 40;
  auto g = random_floats(n, 17);
  for (auto& x : g) x *= 4.0f;
  const auto u = random_floats(n, 18), ds = random_floats(n, 19);
  std::vector<float> out(n, 99.0f), dg(n, 99.0f), du(n, 99.0f);
  cpu::swiglu_forward(g.data(), u.data(), out.data(), n);
  const Vec gd = to_double(g), ud = to_double(u), dsd = to_double(ds);
  CHECK(near(out, ref_swiglu(gd, ud), 1e-5, 1e-7));
  cpu::swiglu_backward(ds.data(), g.data(), u.data(), dg.data(), du.data(), n);
  CHECK(near(dg, numeric_grad(gd, [&](const Vec& x) { return dot(ref_swiglu(x, ud), dsd); }), 1e-3,
             1e-4));
  CHECK(near(du, numeric_grad(ud, [&](const Vec& x) { return dot(ref_swiglu(gd, x), dsd); }), 1e-3,
             1e-4));

  // Saturated gates stay finite: silu(-100) = 0 (exp(100) overflows fp32), silu(100) = 100.
  const float big_g[2] = {-100.0f, 100.0f}, one[2] = {1.0f, 1.0f};
  float s2[2], dg2[2], du2[2];
  cpu::swiglu_forward(big_g, one, s2, 2);
  cpu::swiglu_backward(one, big_g, one, dg2, du2, 2);
  CHECK(s2[0] == 0.0f);
  CHECK(s2[1] == 100.0f);
  CHECK(dg2[0] == 0.0f);
  CHECK(dg2[1] == 1.0f);
}

TEST_CASE("lm cross-entropy: loss, gradient, zero logits, no dlogits, large logits", "[lm_ref]") {
  const std::size_t rows = 4, vocab = 7;
  const float scale = 0.25f;
  auto z = random_floats(rows * vocab, 20);
  for (auto& x : z) x *= 3.0f;
  const auto t = random_tokens(rows, vocab, 21);
  std::vector<float> dz(rows * vocab, 99.0f);
  const double loss = cpu::lm_cross_entropy(z.data(), t.data(), dz.data(), rows, vocab, scale);
  CHECK(loss == Approx(ref_xent(to_double(z), t, vocab)).epsilon(1e-6));
  CHECK(near(
      dz, numeric_grad(to_double(z), [&](const Vec& x) { return scale * ref_xent(x, t, vocab); }),
      1e-3, 1e-4));
  for (std::size_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (std::size_t c = 0; c < vocab; ++c) sum += dz[r * vocab + c];
    CHECK(std::abs(sum) < 1e-6);
  }
  CHECK(cpu::lm_cross_entropy(z.data(), t.data(), nullptr, rows, vocab, scale) == loss);

  const std::vector<float> zero(rows * vocab, 0.0f);
  CHECK(cpu::lm_cross_entropy(zero.data(), t.data(), dz.data(), rows, vocab, 1.0f) ==
        Approx(static_cast<double>(rows) * std::log(static_cast<double>(vocab))).epsilon(1e-7));

  // exp(1000) overflows even a double: the max must be subtracted first.
  const float wide[3] = {1000.0f, 0.0f, -1000.0f};
  const std::int32_t target = 1;
  float dwide[3];
  CHECK(cpu::lm_cross_entropy(wide, &target, dwide, 1, 3, 2.0f) == Approx(1000.0));
  CHECK(dwide[0] == Approx(2.0f));
  CHECK(dwide[1] == Approx(-2.0f));
  CHECK(dwide[2] == 0.0f);
}

TEST_CASE("lm ops on a slice of whole sequences give exactly the whole batch's rows", "[lm_ref]") {
  // 4 sequences of 3 tokens; the slice is sequences 2 and 3 (rows 6-11), reached by offsets.
  const std::size_t batch = 4, seq = 3, heads = 2, hd = 4, dim = heads * hd, vocab = 9;
  const std::size_t rows = batch * seq, half = rows / 2, n = rows * dim, hn = n / 2;
  const std::size_t att_n = batch * heads * seq * seq, hatt = att_n / 2;
  const auto tokens = random_tokens(rows, vocab, 22);
  const auto table = random_floats(vocab * dim, 23), w = random_floats(dim, 24);
  const auto x = random_floats(n, 25), k = random_floats(n, 26), v = random_floats(n, 27);
  const auto r = random_floats(n, 28), z = random_floats(rows * vocab, 29);
  struct Out {
    std::vector<float> emb, y, rstd, dx, dw, rope, att, out, dq, dk, dv, s, dg, du, dz, dtable;
    double loss = 0.0;
  };
  auto run = [&](std::size_t lo, std::size_t rc, std::size_t bc, Out& o) {
    const std::size_t at = lo * dim;
    const std::size_t aat = lo / seq * heads * seq * seq;
    cpu::embedding_forward(&tokens[lo], table.data(), &o.emb[at], rc, dim);
    cpu::embedding_backward(&tokens[lo], &r[at], o.dtable.data(), rc, dim);
    cpu::rmsnorm_forward(&x[at], w.data(), &o.y[at], &o.rstd[lo], rc, dim, 1e-5f);
    cpu::rmsnorm_backward(&r[at], &x[at], w.data(), &o.rstd[lo], &o.dx[at], o.dw.data(), rc, dim);
    std::copy(&x[at], &x[at] + rc * dim, &o.rope[at]);
    cpu::rope_forward(&o.rope[at], rc, seq, heads, hd, 500000.0f);
    cpu::attention_forward(&o.rope[at], &k[at], &v[at], &o.att[aat], &o.out[at], bc, seq, heads,
                           hd);
    cpu::attention_backward(&r[at], &o.rope[at], &k[at], &v[at], &o.att[aat], &o.dq[at], &o.dk[at],
                            &o.dv[at], bc, seq, heads, hd);
    cpu::rope_backward(&o.dq[at], rc, seq, heads, hd, 500000.0f);
    cpu::swiglu_forward(&x[at], &k[at], &o.s[at], rc * dim);
    cpu::swiglu_backward(&r[at], &x[at], &k[at], &o.dg[at], &o.du[at], rc * dim);
    o.loss +=
        cpu::lm_cross_entropy(&z[lo * vocab], &tokens[lo], &o.dz[lo * vocab], rc, vocab, 0.5f);
  };
  auto fresh = [&] {
    Out o;
    for (auto* b : {&o.emb, &o.y, &o.dx, &o.rope, &o.out, &o.dq, &o.dk, &o.dv, &o.s, &o.dg, &o.du})
      b->assign(n, -7.0f);
    o.rstd.assign(rows, -7.0f);
    o.att.assign(att_n, -7.0f);
    o.dz.assign(rows * vocab, -7.0f);
    o.dw.assign(dim, 0.0f);
    o.dtable.assign(vocab * dim, 0.0f);
    return o;
  };
  Out whole = fresh(), parts = fresh();
  run(0, rows, batch, whole);
  run(0, half, batch / 2, parts);  // the same accumulators, first half then second half
  run(half, half, batch / 2, parts);
  Out second = fresh();
  run(half, half, batch / 2, second);

  for (auto m : {&Out::emb, &Out::y, &Out::dx, &Out::rope, &Out::out, &Out::dq, &Out::dk, &Out::dv,
                 &Out::s, &Out::dg, &Out::du}) {
    CHECK(same(&(second.*m)[hn], &(whole.*m)[hn], hn));
    CHECK((parts.*m) == (whole.*m));
  }
  CHECK(same(&second.rstd[half], &whole.rstd[half], half));
  CHECK(same(&second.att[hatt], &whole.att[hatt], hatt));
  CHECK(same(&second.dz[half * vocab], &whole.dz[half * vocab], half * vocab));
  CHECK(parts.dw == whole.dw);  // accumulated rows in the same order
  CHECK(parts.dtable == whole.dtable);
  CHECK(parts.loss == Approx(whole.loss).epsilon(1e-12));
}

TEST_CASE("swiglu backward in place (dg is ds) gives the same gradients", "[lm_ref]") {
  const std::vector<float> g = {-2.0f, -0.5f, 0.0f, 0.7f, 3.0f};
  const std::vector<float> u = {1.5f, -1.0f, 2.0f, 0.25f, -0.75f};
  const std::vector<float> ds = {0.3f, -1.2f, 0.8f, 2.0f, -0.4f};
  std::vector<float> dg(5), du(5), du2(5);
  ddp::kernels::cpu::swiglu_backward(ds.data(), g.data(), u.data(), dg.data(), du.data(), 5);
  std::vector<float> inplace = ds;
  ddp::kernels::cpu::swiglu_backward(inplace.data(), g.data(), u.data(), inplace.data(), du2.data(),
                                     5);
  CHECK(inplace == dg);
  CHECK(du2 == du);
}
