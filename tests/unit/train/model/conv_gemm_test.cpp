// The trainer's im2col + sgemm conv2d (conv_gemm.hpp) against the plain-loop references of
// ddp/kernels/conv_ref.hpp: forward, and backward's weight and bias gradients (accumulated onto
// what is there) and input gradient (overwritten, or skipped when dx is null), over batches of
// 1 to 3, 1 to 5 input channels, kernels 1 to 5 and non-square inputs, reusing one scratch;
// with the batch split over 1, 2 and 3 threads (set_conv_threads), deterministic for a count.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/random_floats.hpp"
#include <cblas.h>

#include "conv_gemm.hpp"
#include "ddp/kernels/conv_ref.hpp"

namespace cpu = ddp::kernels::cpu;
using ddp::kernels::Conv2dShape;

namespace {

// The largest |a - b| relative to the reference's largest magnitude (at least 1).
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 1.0, worst = 0.0;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return worst / scale;
}

std::string describe(const Conv2dShape& s) {
  std::ostringstream o;
  o << "batch " << s.batch << ", in " << s.in_channels << "x" << s.in_h << "x" << s.in_w << ", out "
    << s.out_channels << ", kernel " << s.kernel_h << "x" << s.kernel_w;
  return o.str();
}

constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("conv2d im2col + sgemm equals the plain references, forward and backward",
          "[unit][train]") {
  const int threads = GENERATE(1, 2, 3);
  ddp::train::set_conv_threads(threads);
  INFO("conv threads " << threads);
  std::vector<float> scratch;  // one scratch for every shape: it grows and is reused
  std::uint32_t seed = 1;
  std::size_t shapes = 0;
  for (std::size_t batch : {1u, 2u, 3u}) {
    for (std::size_t in_c : {1u, 2u, 5u}) {
      for (std::size_t k : {1u, 2u, 3u, 5u}) {
        const std::size_t out_c = 1 + (batch + in_c + k) % 4;
        const Conv2dShape s{batch, in_c, 7 + k, 9 + batch, out_c, k, k};
        INFO(describe(s));
        ++shapes;
        const auto x = random_floats(s.x_size(), seed++);
        const auto w = random_floats(s.w_size(), seed++);
        const auto b = random_floats(out_c, seed++);
        const auto dy = random_floats(s.y_size(), seed++);

        std::vector<float> y(s.y_size(), 7.0f), y_ref(s.y_size());
        ddp::train::conv2d_gemm_forward(x.data(), w.data(), b.data(), y.data(), s, scratch);
        cpu::conv2d_forward(x.data(), w.data(), b.data(), y_ref.data(), s);
        CHECK(rel_error(y, y_ref) < kTol);

        // Gradients accumulate onto what is there; dx is overwritten.
        const auto dw0 = random_floats(s.w_size(), seed++);
        const auto db0 = random_floats(out_c, seed++);
        std::vector<float> dw = dw0, db = db0, dx(s.x_size(), 3.0f);
        std::vector<float> dw_ref = dw0, db_ref = db0, dx_ref(s.x_size());
        ddp::train::conv2d_gemm_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(),
                                         db.data(), s, scratch);
        cpu::conv2d_backward_weight(dy.data(), x.data(), dw_ref.data(), s);
        cpu::conv2d_backward_bias(dy.data(), db_ref.data(), s);
        cpu::conv2d_backward_input(dy.data(), w.data(), dx_ref.data(), s);
        CHECK(rel_error(dw, dw_ref) < kTol);
        CHECK(rel_error(db, db_ref) < kTol);
        CHECK(rel_error(dx, dx_ref) < kTol);

        // The first layer: no input gradient, the same weight gradient.
        std::vector<float> dw2 = dw0, db2 = db0;
        ddp::train::conv2d_gemm_backward(dy.data(), x.data(), w.data(), nullptr, dw2.data(),
                                         db2.data(), s, scratch);
        CHECK(rel_error(dw2, dw_ref) < kTol);
        CHECK(rel_error(db2, db_ref) < kTol);
        // The same thread count: the very same bits.
        std::vector<float> dw3 = dw0, db3 = db0, dx3(s.x_size());
        ddp::train::conv2d_gemm_backward(dy.data(), x.data(), w.data(), dx3.data(), dw3.data(),
                                         db3.data(), s, scratch);
        CHECK(dw3 == dw);
        CHECK(db3 == db);
        CHECK(dx3 == dx);
      }
    }
  }
  CHECK(shapes == 36);
  ddp::train::set_conv_threads(1);
}

TEST_CASE("conv threads are clamped to [1, 64]", "[unit][train]") {
  ddp::train::set_conv_threads(0);
  CHECK(ddp::train::conv_threads() == 1);
  ddp::train::set_conv_threads(1000);
  CHECK(ddp::train::conv_threads() == ddp::train::kMaxConvThreads);
  ddp::train::set_conv_threads(1);
  CHECK(ddp::train::conv_threads() == 1);
}

TEST_CASE("conv2d im2col + sgemm: a rectangular kernel, no bias, the convnet's conv2",
          "[unit][train]") {
  ddp::train::set_conv_threads(GENERATE(1, 2));
  std::vector<float> scratch;
  SECTION("3x2 kernel without bias") {
    const Conv2dShape s{2, 3, 6, 5, 4, 3, 2};
    const auto x = random_floats(s.x_size(), 101);
    const auto w = random_floats(s.w_size(), 102);
    std::vector<float> y(s.y_size()), y_ref(s.y_size());
    ddp::train::conv2d_gemm_forward(x.data(), w.data(), nullptr, y.data(), s, scratch);
    cpu::conv2d_forward(x.data(), w.data(), nullptr, y_ref.data(), s);
    CHECK(rel_error(y, y_ref) < kTol);
  }
  SECTION("32 -> 64 channels, 26x26 -> 24x24, 2 samples") {
    const Conv2dShape s{2, 32, 26, 26, 64, 3, 3};
    const auto x = random_floats(s.x_size(), 201);
    const auto w = random_floats(s.w_size(), 202);
    const auto b = random_floats(64, 203);
    const auto dy = random_floats(s.y_size(), 204);
    std::vector<float> y(s.y_size()), y_ref(s.y_size());
    ddp::train::conv2d_gemm_forward(x.data(), w.data(), b.data(), y.data(), s, scratch);
    cpu::conv2d_forward(x.data(), w.data(), b.data(), y_ref.data(), s);
    CHECK(rel_error(y, y_ref) < kTol);
    std::vector<float> dw(s.w_size()), db(64), dx(s.x_size());
    std::vector<float> dw_ref(s.w_size()), db_ref(64), dx_ref(s.x_size());
    ddp::train::conv2d_gemm_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(),
                                     s, scratch);
    cpu::conv2d_backward_weight(dy.data(), x.data(), dw_ref.data(), s);
    cpu::conv2d_backward_bias(dy.data(), db_ref.data(), s);
    cpu::conv2d_backward_input(dy.data(), w.data(), dx_ref.data(), s);
    // Sums of 1152 (dW) and 576 x 2 (db) products: float rounding grows with the length.
    CHECK(rel_error(dw, dw_ref) < 1e-5);
    CHECK(rel_error(db, db_ref) < 1e-5);
    CHECK(rel_error(dx, dx_ref) < kTol);
  }
  ddp::train::set_conv_threads(1);
}

TEST_CASE(
    "parallel_sgemm: cblas_sgemm's bits on one thread, its values on two, the same bits "
    "each time",
    "[unit][train]") {
  // The convnet's fc1 products: forward (B transposed), the weight gradient (A transposed,
  // accumulated) and the input gradient.
  struct Case {
    bool ta, tb;
    int m, n, k;
    float beta;
  };
  const Case cases[] = {{false, true, 64, 128, 9216, 0.0f},
                        {true, false, 128, 9216, 64, 1.0f},
                        {false, false, 64, 9216, 128, 0.0f},
                        {false, false, 5, 10, 7, 0.0f}};  // too narrow to cut: one call
  std::uint32_t seed = 300;
  for (const auto& c : cases) {
    INFO("m " << c.m << ", n " << c.n << ", k " << c.k);
    const int lda = c.ta ? c.m : c.k, ldb = c.tb ? c.k : c.n;
    const auto a = random_floats(static_cast<std::size_t>(c.m) * c.k, ++seed);
    const auto b = random_floats(static_cast<std::size_t>(c.k) * c.n, ++seed);
    const auto c0 = random_floats(static_cast<std::size_t>(c.m) * c.n, ++seed);
    auto run = [&](int threads) {
      ddp::train::set_conv_threads(threads);
      std::vector<float> out = c0;
      ddp::train::parallel_sgemm(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), lda, b.data(), ldb,
                                 c.beta, out.data(), c.n);
      return out;
    };
    std::vector<float> blas = c0;
    cblas_sgemm(CblasRowMajor, c.ta ? CblasTrans : CblasNoTrans, c.tb ? CblasTrans : CblasNoTrans,
                c.m, c.n, c.k, 1.0f, a.data(), lda, b.data(), ldb, c.beta, blas.data(), c.n);
    CHECK(run(1) == blas);
    const auto two = run(2);
    CHECK(run(2) == two);
    CHECK(rel_error(two, blas) < 1e-5);
  }
  ddp::train::set_conv_threads(1);
}
