// The convnet layers' CPU references (conv_ref.hpp): conv2d and max-pool against direct
// formulas in double, their backward passes by finite differences, dropout's mask (statistics,
// determinism, the hash itself), Adadelta against a step worked by hand, and conv2d, max-pool
// and Adadelta against values PyTorch computed (the last test case).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/random_floats.hpp"
#include "ddp/kernels/conv_ref.hpp"
#include "ddp/proto/error.hpp"

namespace cpu = ddp::kernels::cpu;
using ddp::kernels::Conv2dShape;
using ddp::kernels::PoolShape;

namespace {

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// |a - b| <= tol * (1 + |b|), naming the first index that is not.
bool near(const std::vector<float>& a, const std::vector<double>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - b[i]) <= tol * (1.0 + std::abs(b[i])))) {
      UNSCOPED_INFO("index " << i << ": got " << a[i] << ", expected " << b[i]);
      return false;
    }
  }
  return true;
}

// y[b][o][oy][ox] = bias[o] + sum over c, ky, kx of x[b][c][oy+ky][ox+kx] w[o][c][ky][kx].
std::vector<double> direct_conv(const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& bias, const Conv2dShape& s) {
  std::vector<double> y(s.y_size());
  const std::size_t oh = s.out_h(), ow = s.out_w();
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t o = 0; o < s.out_channels; ++o)
      for (std::size_t oy = 0; oy < oh; ++oy)
        for (std::size_t ox = 0; ox < ow; ++ox) {
          double acc = bias.empty() ? 0.0 : bias[o];
          for (std::size_t c = 0; c < s.in_channels; ++c)
            for (std::size_t ky = 0; ky < s.kernel_h; ++ky)
              for (std::size_t kx = 0; kx < s.kernel_w; ++kx)
                acc += static_cast<double>(
                           x[((b * s.in_channels + c) * s.in_h + oy + ky) * s.in_w + ox + kx]) *
                       w[((o * s.in_channels + c) * s.kernel_h + ky) * s.kernel_w + kx];
          y[((b * s.out_channels + o) * oh + oy) * ow + ox] = acc;
        }
  return y;
}

const Conv2dShape kConvShapes[] = {
    // batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w
    {1, 1, 3, 3, 1, 3, 3},  // the kernel covers the input: one output
    {2, 1, 6, 5, 3, 3, 3},  // MNIST's first layer, small
    {3, 4, 7, 6, 5, 3, 3},  // its second layer, small
    {2, 3, 5, 8, 2, 2, 4},  // a non-square kernel
    {1, 2, 4, 4, 3, 1, 1},  // 1x1: a per-pixel matrix product
};

// L = sum of r * conv(x, w, b) in double; d L / d(any input) is what backward computes for dy=r.
double conv_loss(const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& b, const std::vector<float>& r, const Conv2dShape& s) {
  std::vector<float> y(s.y_size());
  cpu::conv2d_forward(x.data(), w.data(), b.data(), y.data(), s);
  return dot(y, r);
}

// Central differences of conv_loss in each element of v (one of x, w, b). The loss is linear in
// each of them, so a step of 0.5 is exact up to rounding.
std::vector<double> finite_difference(std::vector<float>& v, const std::vector<float>& x,
                                      const std::vector<float>& w, const std::vector<float>& b,
                                      const std::vector<float>& r, const Conv2dShape& s) {
  std::vector<double> g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float keep = v[i];
    v[i] = keep + 0.5f;
    const double up = conv_loss(x, w, b, r, s);
    v[i] = keep - 0.5f;
    const double down = conv_loss(x, w, b, r, s);
    v[i] = keep;
    g[i] = up - down;
  }
  return g;
}

}  // namespace

TEST_CASE("conv2d forward equals the direct formula, with and without bias", "[unit][kernels]") {
  for (const auto& s : kConvShapes) {
    CAPTURE(s.batch, s.in_channels, s.in_h, s.in_w, s.out_channels, s.kernel_h, s.kernel_w);
    const auto x = random_floats(s.x_size(), 1), w = random_floats(s.w_size(), 2);
    const auto b = random_floats(s.out_channels, 3);
    std::vector<float> y(s.y_size(), 99.0f);
    cpu::conv2d_forward(x.data(), w.data(), b.data(), y.data(), s);
    CHECK(near(y, direct_conv(x, w, b, s), 1e-5));
    cpu::conv2d_forward(x.data(), w.data(), nullptr, y.data(), s);
    CHECK(near(y, direct_conv(x, w, {}, s), 1e-5));
  }
}

TEST_CASE("conv2d backward: input, weight and bias gradients match finite differences",
          "[unit][kernels]") {
  for (const auto& s : kConvShapes) {
    CAPTURE(s.batch, s.in_channels, s.in_h, s.in_w, s.out_channels, s.kernel_h, s.kernel_w);
    auto x = random_floats(s.x_size(), 4), w = random_floats(s.w_size(), 5);
    auto b = random_floats(s.out_channels, 6);
    const auto r = random_floats(s.y_size(), 7);  // dy

    std::vector<float> dx(s.x_size(), 99.0f);  // overwritten
    cpu::conv2d_backward_input(r.data(), w.data(), dx.data(), s);
    CHECK(near(dx, finite_difference(x, x, w, b, r, s), 1e-4));

    // The weight and bias gradients accumulate: start from known values and subtract them.
    const auto dw0 = random_floats(s.w_size(), 8), db0 = random_floats(s.out_channels, 9);
    auto dw = dw0, db = db0;
    cpu::conv2d_backward_weight(r.data(), x.data(), dw.data(), s);
    cpu::conv2d_backward_bias(r.data(), db.data(), s);
    auto fd_w = finite_difference(w, x, w, b, r, s), fd_b = finite_difference(b, x, w, b, r, s);
    for (std::size_t i = 0; i < fd_w.size(); ++i) fd_w[i] += dw0[i];
    for (std::size_t i = 0; i < fd_b.size(); ++i) fd_b[i] += db0[i];
    CHECK(near(dw, fd_w, 1e-4));
    CHECK(near(db, fd_b, 1e-4));
  }
}

TEST_CASE("conv2d and max-pool reject shapes they cannot run, naming the sizes",
          "[unit][kernels]") {
  std::vector<float> buf(64);
  std::vector<std::int32_t> idx(64);
  const Conv2dShape too_big{1, 1, 2, 2, 1, 3, 3};
  CHECK_THROWS_AS(cpu::conv2d_forward(buf.data(), buf.data(), nullptr, buf.data(), too_big),
                  ddp::ConfigError);
  CHECK_THROWS_WITH(ddp::kernels::check_shape(too_big),
                    Catch::Contains("3x3") && Catch::Contains("2x2"));
  CHECK_THROWS_WITH(ddp::kernels::check_shape(Conv2dShape{1, 1, 4, 4, 1, 0, 3}),
                    Catch::Contains("0x3"));
  CHECK_THROWS_AS(cpu::maxpool_forward(buf.data(), buf.data(), idx.data(), PoolShape{1, 1, 1, 2}),
                  ddp::ConfigError);
  CHECK_THROWS_WITH(ddp::kernels::check_shape(PoolShape{1, 4, 4, 0}), Catch::Contains("0"));
}

TEST_CASE("max-pool picks each window's maximum, trims partial windows, routes the gradient",
          "[unit][kernels]") {
  // 2 planes of 5x7, k = 2: 2x3 outputs per plane; the last row and column are ignored.
  const PoolShape s{2, 5, 7, 2};
  REQUIRE(s.out_h() == 2);
  REQUIRE(s.out_w() == 3);
  // Distinct values, at least 0.01 apart, in a shuffled order.
  std::vector<float> x(s.x_size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.01f - 0.3f;
  std::shuffle(x.begin(), x.end(), std::mt19937(11));
  std::vector<float> y(s.y_size());
  std::vector<std::int32_t> argmax(s.y_size());
  cpu::maxpool_forward(x.data(), y.data(), argmax.data(), s);
  for (std::size_t p = 0; p < s.planes; ++p)
    for (std::size_t oy = 0; oy < 2; ++oy)
      for (std::size_t ox = 0; ox < 3; ++ox) {
        const float* xp = x.data() + p * 35;
        float best = -1e30f;
        std::size_t at = 0;
        for (std::size_t ky = 0; ky < 2; ++ky)
          for (std::size_t kx = 0; kx < 2; ++kx) {
            const std::size_t i = (2 * oy + ky) * 7 + 2 * ox + kx;
            if (xp[i] > best) {
              best = xp[i];
              at = i;
            }
          }
        const std::size_t j = (p * 2 + oy) * 3 + ox;
        CHECK(y[j] == best);
        CHECK(argmax[j] == static_cast<std::int32_t>(at));
      }

  // Backward by finite differences of L = sum r * y: exact for steps smaller than the gaps.
  const auto r = random_floats(s.y_size(), 12);
  std::vector<float> dx(s.x_size(), 99.0f);
  cpu::maxpool_backward(r.data(), argmax.data(), dx.data(), s);
  std::vector<double> fd(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + 0.002f;
    cpu::maxpool_forward(x.data(), y.data(), argmax.data(), s);
    const double up = dot(y, r);
    x[i] = keep - 0.002f;
    cpu::maxpool_forward(x.data(), y.data(), argmax.data(), s);
    x[i] = keep;
    fd[i] = (up - dot(y, r)) / 0.004;
  }
  CHECK(near(dx, fd, 1e-3));
  for (std::size_t i = 4 * 7; i < 5 * 7; ++i) CHECK(dx[i] == 0.0f);  // the ignored last row
}

TEST_CASE("max-pool ties, NaN and -inf follow PyTorch", "[unit][kernels]") {
  const PoolShape s{1, 2, 6, 2};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Windows: {1,3,1,3} tie -> first; {nan,5,nan,2} -> the last NaN; {-inf x4} -> the first.
  const std::vector<float> x = {1, 3, nan, 5, -inf, -inf, 1, 3, nan, 2, -inf, -inf};
  std::vector<float> y(3);
  std::vector<std::int32_t> argmax(3);
  cpu::maxpool_forward(x.data(), y.data(), argmax.data(), s);
  CHECK(y[0] == 3.0f);
  CHECK(argmax[0] == 1);
  CHECK(std::isnan(y[1]));
  CHECK(argmax[1] == 8);
  CHECK(y[2] == -inf);
  CHECK(argmax[2] == 4);
}

TEST_CASE("dropout's hash is splitmix64 and its mask has the asked-for statistics",
          "[unit][kernels]") {
  // splitmix64's first outputs from state 0 (Vigna's reference code).
  CHECK(ddp::kernels::mix64(0) == 0xe220a8397b1dcdafull);
  CHECK(ddp::kernels::mix64(0x9e3779b97f4a7c15ull) == 0x6e789e6aa1b965f4ull);
  CHECK(ddp::kernels::dropout_threshold(0.0f) == 0);
  CHECK(ddp::kernels::dropout_threshold(0.5f) == 1u << 23);
  CHECK(ddp::kernels::dropout_threshold(1.0f) == 1u << 24);
  CHECK(ddp::kernels::dropout_scale(0.5f) == 2.0f);
  CHECK(ddp::kernels::dropout_scale(0.25f) == Approx(4.0 / 3.0).epsilon(1e-7));

  const std::size_t n = 200000;
  const float p = 0.25f, scale = ddp::kernels::dropout_scale(p);
  const auto x = random_floats(n, 13);
  std::vector<float> y(n);
  std::vector<std::uint8_t> mask(n, 7);
  cpu::dropout_forward(x.data(), y.data(), mask.data(), n, p, 42, 1000);
  std::size_t kept = 0, pairs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(mask[i] <= 1);
    kept += mask[i];
    if (i > 0) pairs += mask[i] & mask[i - 1];
    REQUIRE(y[i] == (mask[i] != 0 ? x[i] * scale : 0.0f));
  }
  // Binomial: 5 standard deviations of the kept fraction are 0.005 here; neighbours independent.
  CHECK(std::abs(static_cast<double>(kept) / static_cast<double>(n) - 0.75) < 0.005);
  CHECK(std::abs(static_cast<double>(pairs) / static_cast<double>(n - 1) - 0.5625) < 0.006);

  // Another seed draws another mask: agreement p^2 + (1-p)^2 = 0.625, not 1.
  std::vector<std::uint8_t> other(n);
  cpu::dropout_forward(x.data(), y.data(), other.data(), n, p, 43, 1000);
  std::size_t same = 0;
  for (std::size_t i = 0; i < n; ++i) same += mask[i] == other[i] ? 1 : 0;
  CHECK(std::abs(static_cast<double>(same) / static_cast<double>(n) - 0.625) < 0.006);
}

TEST_CASE("dropout is a function of (seed, offset): repeatable, splittable, backward agrees",
          "[unit][kernels]") {
  const std::size_t n = 1000;
  const auto x = random_floats(n, 14);
  std::vector<float> y1(n), y2(n);
  std::vector<std::uint8_t> m1(n), m2(n);
  cpu::dropout_forward(x.data(), y1.data(), m1.data(), n, 0.5f, 7, 0);
  cpu::dropout_forward(x.data(), y2.data(), m2.data(), n, 0.5f, 7, 0);
  CHECK(y1 == y2);
  CHECK(m1 == m2);
  // Two calls over halves, the second at offset 600, give the same mask as one call.
  cpu::dropout_forward(x.data(), y2.data(), m2.data(), 600, 0.5f, 7, 0);
  cpu::dropout_forward(x.data() + 600, y2.data() + 600, m2.data() + 600, n - 600, 0.5f, 7, 600);
  CHECK(m1 == m2);
  CHECK(y1 == y2);
  // In place, and backward: dy through the same mask and scale, with nothing stored.
  auto inplace = x;
  cpu::dropout_forward(inplace.data(), inplace.data(), nullptr, n, 0.5f, 7, 0);
  CHECK(inplace == y1);
  const auto dy = random_floats(n, 15);
  std::vector<float> dx(n);
  cpu::dropout_backward(dy.data(), dx.data(), n, 0.5f, 7, 0);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(dx[i] == (m1[i] != 0 ? dy[i] * 2.0f : 0.0f));

  // p = 0 keeps everything unchanged; p = 1 drops everything; p outside [0, 1] is refused.
  cpu::dropout_forward(x.data(), y1.data(), m1.data(), n, 0.0f, 7, 0);
  CHECK(y1 == x);
  CHECK(std::count(m1.begin(), m1.end(), 1) == static_cast<std::ptrdiff_t>(n));
  cpu::dropout_forward(x.data(), y1.data(), m1.data(), n, 1.0f, 7, 0);
  CHECK(std::count(y1.begin(), y1.end(), 0.0f) == static_cast<std::ptrdiff_t>(n));
  CHECK(std::count(m1.begin(), m1.end(), 0) == static_cast<std::ptrdiff_t>(n));
  for (float bad : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    CHECK_THROWS_WITH(cpu::dropout_forward(x.data(), y1.data(), nullptr, n, bad, 7, 0),
                      Catch::Contains("dropout") && Catch::Contains("[0, 1]"));
  }
}

TEST_CASE("Adadelta: one step worked by hand, then steps against the formula in double",
          "[unit][kernels]") {
  // g = 2, lr 1, rho 0.9, eps 1e-6, state zero:
  //   sq = 0.1 * 4 = 0.4;  delta = sqrt(1e-6) / sqrt(0.400001) * 2 = 0.00316227371...
  //   acc = 0.1 * delta^2 = 9.99998e-7;  p = 1 - delta = 0.99683772628...
  std::vector<float> p = {1.0f}, g = {2.0f}, sq = {0.0f}, acc = {0.0f};
  cpu::adadelta_step(p.data(), g.data(), sq.data(), acc.data(), 1, 1.0f, 0.9f, 1e-6f);
  CHECK(sq[0] == Approx(0.4).epsilon(1e-6));
  CHECK(acc[0] == Approx(9.99997500006e-7).epsilon(1e-5));
  CHECK(p[0] == Approx(0.996837726).epsilon(1e-6));

  // Five steps on 100 elements with lr 0.7 against the same formula in double.
  const std::size_t n = 100;
  auto pf = random_floats(n, 16);
  std::vector<float> sqf(n, 0.0f), accf(n, 0.0f);
  std::vector<double> pd(pf.begin(), pf.end()), sqd(n, 0.0), accd(n, 0.0);
  for (std::uint32_t step = 0; step < 5; ++step) {
    const auto grad = random_floats(n, 100 + step);
    cpu::adadelta_step(pf.data(), grad.data(), sqf.data(), accf.data(), n, 0.7f, 0.9f, 1e-6f);
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = grad[i], rho = 0.9f, eps = 1e-6f;
      sqd[i] = rho * sqd[i] + (1 - rho) * gi * gi;
      const double delta = std::sqrt(accd[i] + eps) / std::sqrt(sqd[i] + eps) * gi;
      accd[i] = rho * accd[i] + (1 - rho) * delta * delta;
      pd[i] -= 0.7f * delta;
    }
  }
  CHECK(near(pf, pd, 1e-5));
  CHECK(near(accf, accd, 1e-5));
  CHECK(near(sqf, sqd, 1e-5));
}

namespace {

std::vector<float> wave(std::size_t n, double a, double b, double c, double (*fn)(double)) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(a * fn(b * static_cast<double>(i) + c));
  return v;
}

double sine(double v) { return std::sin(v); }
double cosine(double v) { return std::cos(v); }

double checksum(const std::vector<float>& v) {  // sum of v[i] cos(0.13 i)
  double s = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * std::cos(0.13 * static_cast<double>(i));
  return s;
}

}  // namespace

// Expected values from torch 2.15 (float64 for conv2d and max-pool, float32 for Adadelta):
//   x = sin(0.37 i + 0.1) [1,2,4,5]; w = 0.5 cos(0.23 i) [3,2,3,3]; b = 0.1 i - 0.1;
//   y = F.conv2d(x, w, b); y.backward(dy = sin(0.71 i)); grads summed as checksum() does;
//   F.max_pool2d(sin(1.7 i) [1,2,5,7], 2, return_indices=True);
//   Adadelta(rho 0.9, eps 1e-6) on p = sin(i + 1) [8], grads cos(0.5 i + t), lr 1, 0.7, 0.49.
TEST_CASE("conv2d, max-pool and Adadelta agree with PyTorch", "[unit][kernels]") {
  const Conv2dShape s{1, 2, 4, 5, 3, 3, 3};
  const auto x = wave(40, 1.0, 0.37, 0.1, sine), w = wave(54, 0.5, 0.23, 0.0, cosine);
  std::vector<float> b = {-0.1f, 0.0f, 0.1f}, y(18);
  cpu::conv2d_forward(x.data(), w.data(), b.data(), y.data(), s);
  CHECK(near(y,
             {1.78050702, 2.17353245, 2.25884593, 0.764812192, -0.0907839464, -0.947627409,
              0.186942901, -0.690881363, -1.47519809, -2.35139298, -2.01881822, -1.41300589,
              -1.9830192, -1.42511201, -0.660788041, 1.78241324, 2.2777366, 2.47831351},
             1e-6));
  const auto dy = wave(18, 1.0, 0.71, 0.0, sine);
  std::vector<float> dx(40), dw(54, 0.0f), db(3, 0.0f);
  cpu::conv2d_backward_input(dy.data(), w.data(), dx.data(), s);
  cpu::conv2d_backward_weight(dy.data(), x.data(), dw.data(), s);
  cpu::conv2d_backward_bias(dy.data(), db.data(), s);
  CHECK(checksum(dx) == Approx(7.8650537426).epsilon(1e-6));
  CHECK(checksum(dw) == Approx(17.1717018304).epsilon(1e-6));
  CHECK(near(db, {2.38805655, -0.599061646, -1.86433841}, 1e-6));

  const PoolShape ps{2, 5, 7, 2};
  const auto px = wave(70, 1.0, 1.7, 0.0, sine);
  std::vector<float> py(12);
  std::vector<std::int32_t> idx(12);
  cpu::maxpool_forward(px.data(), py.data(), idx.data(), ps);
  CHECK(near(py,
             {0.991664827, 0.396740586, 0.999792874, 0.35905835, 0.985600293, 0.773327887,
              0.755640209, 0.980589509, 0.333313942, 0.998858035, 0.421778291, 0.994826794},
             1e-7));
  CHECK(idx == std::vector<std::int32_t>{1, 9, 12, 15, 23, 19, 7, 3, 11, 14, 17, 25});

  auto p = wave(8, 1.0, 1.0, 1.0, sine);
  std::vector<float> sq(8, 0.0f), acc(8, 0.0f);
  const float lrs[] = {1.0f, 0.7f, 0.49f};
  for (int t = 0; t < 3; ++t) {
    const auto g = wave(8, 1.0, 0.5, t, cosine);
    cpu::adadelta_step(p.data(), g.data(), sq.data(), acc.data(), 8, lrs[t], 0.9f, 1e-6f);
  }
  CHECK(near(p,
             {0.837652504, 0.907394111, 0.142080322, -0.754476368, -0.95125258, -0.273327768,
              0.661311209, 0.991853356},
             1e-6));
}
