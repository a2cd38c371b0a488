// The convnet's CUDA kernels (conv_ops.hpp) against their CPU references (conv_ref.hpp), at the
// MNIST convnet's own shapes and at odd ones. Runs only with a GPU (gpu_main.cpp exits 77, a
// visible skip, without one). Max-pool and dropout must match bit for bit; sums (conv2d, its
// gradients) within 1e-4 relative, their order differing; Adadelta within a few ulps.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/random_floats.hpp"
#include "ddp/kernels/conv_ops.hpp"
#include "ddp/kernels/conv_ref.hpp"
#include "ddp/proto/error.hpp"

namespace cpu = ddp::kernels::cpu;
namespace gpu = ddp::kernels::cuda;
using ddp::kernels::Conv2dShape;
using ddp::kernels::PoolShape;

namespace {

void ok(cudaError_t rc) { REQUIRE(rc == cudaSuccess); }

// A device copy of a host vector, freed at scope end.
template <typename T>
struct Dev {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& host) : n(host.size()) {
    ok(cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(T)));
    if (n > 0) ok(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(ptr); }
  std::vector<T> get() const {
    ok(cudaDeviceSynchronize());
    std::vector<T> out(n);
    if (n > 0) ok(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

bool close(const std::vector<float>& a, const std::vector<float>& b, float rel, float abs_tol) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - b[i]) <= abs_tol + rel * std::abs(b[i]))) {
      UNSCOPED_INFO("index " << i << ": gpu " << a[i] << " cpu " << b[i]);
      return false;
    }
  }
  return true;
}

const Conv2dShape kConvShapes[] = {
    // batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w
    {4, 1, 28, 28, 32, 3, 3},   // the MNIST convnet's conv1
    {4, 32, 26, 26, 64, 3, 3},  // and its conv2
    {1, 1, 3, 3, 1, 3, 3},      // one output
    {3, 5, 9, 7, 6, 2, 4},      // odd sizes, a non-square kernel
    {2, 3, 4, 5, 7, 1, 1},      // 1x1
};

}  // namespace

TEST_CASE("conv2d forward and its three gradients match the CPU", "[gpu][kernels][conv]") {
  for (const auto& s : kConvShapes) {
    CAPTURE(s.batch, s.in_channels, s.in_h, s.in_w, s.out_channels, s.kernel_h, s.kernel_w);
    const auto x = random_floats(s.x_size(), 1), w = random_floats(s.w_size(), 2);
    const auto b = random_floats(s.out_channels, 3), dy = random_floats(s.y_size(), 4);
    Dev<float> gx(x), gw(w), gb(b), gdy(dy);

    std::vector<float> y(s.y_size());
    Dev<float> gy(y);
    gpu::conv2d_forward(gx.ptr, gw.ptr, gb.ptr, gy.ptr, s, nullptr);
    cpu::conv2d_forward(x.data(), w.data(), b.data(), y.data(), s);
    CHECK(close(gy.get(), y, 1e-4f, 1e-4f));
    gpu::conv2d_forward(gx.ptr, gw.ptr, nullptr, gy.ptr, s, nullptr);
    cpu::conv2d_forward(x.data(), w.data(), nullptr, y.data(), s);
    CHECK(close(gy.get(), y, 1e-4f, 1e-4f));

    std::vector<float> dx(s.x_size(), 99.0f);  // overwritten on both sides
    Dev<float> gdx(dx);
    gpu::conv2d_backward_input(gdy.ptr, gw.ptr, gdx.ptr, s, nullptr);
    cpu::conv2d_backward_input(dy.data(), w.data(), dx.data(), s);
    CHECK(close(gdx.get(), dx, 1e-4f, 1e-4f));

    auto dw = random_floats(s.w_size(), 5), db = random_floats(s.out_channels, 6);  // += onto
    Dev<float> gdw(dw), gdb(db);
    gpu::conv2d_backward_weight(gdy.ptr, gx.ptr, gdw.ptr, s, nullptr);
    gpu::conv2d_backward_bias(gdy.ptr, gdb.ptr, s, nullptr);
    cpu::conv2d_backward_weight(dy.data(), x.data(), dw.data(), s);
    cpu::conv2d_backward_bias(dy.data(), db.data(), s);
    CHECK(close(gdw.get(), dw, 1e-4f, 1e-3f));  // sums of up to 2704 terms of size 1
    CHECK(close(gdb.get(), db, 1e-4f, 1e-3f));
  }
}

TEST_CASE("conv2d gradients repeat bit for bit, bad shapes throw before any launch",
          "[gpu][kernels][conv]") {
  const Conv2dShape s{4, 32, 26, 26, 64, 3, 3};
  const auto x = random_floats(s.x_size(), 7), dy = random_floats(s.y_size(), 8);
  const std::vector<float> zeros(s.w_size(), 0.0f);
  Dev<float> gx(x), gdy(dy), a(zeros), b(zeros);
  gpu::conv2d_backward_weight(gdy.ptr, gx.ptr, a.ptr, s, nullptr);
  gpu::conv2d_backward_weight(gdy.ptr, gx.ptr, b.ptr, s, nullptr);
  CHECK(a.get() == b.get());

  const Conv2dShape bad{1, 1, 2, 2, 1, 3, 3};
  CHECK_THROWS_AS(gpu::conv2d_forward(gx.ptr, gx.ptr, nullptr, gx.ptr, bad, nullptr),
                  ddp::ConfigError);
  CHECK_THROWS_AS(gpu::maxpool_forward(gx.ptr, gx.ptr, nullptr, PoolShape{1, 1, 1, 2}, nullptr),
                  ddp::ConfigError);
  // Nothing to do launches nothing and fails nothing.
  CHECK_NOTHROW(gpu::conv2d_forward(nullptr, nullptr, nullptr, nullptr,
                                    Conv2dShape{0, 1, 28, 28, 32, 3, 3}, nullptr));
  CHECK_NOTHROW(
      gpu::adadelta_step(nullptr, nullptr, nullptr, nullptr, 0, 1.0f, 0.9f, 1e-6f, nullptr));
  ok(cudaDeviceSynchronize());
}

TEST_CASE("max-pool forward, argmax and backward equal the CPU exactly", "[gpu][kernels][conv]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const PoolShape& s : {PoolShape{4 * 64, 24, 24, 2}, PoolShape{3, 5, 7, 2},
                             PoolShape{2, 9, 9, 3}, PoolShape{1, 2, 6, 2}}) {
    CAPTURE(s.planes, s.in_h, s.in_w, s.k);
    auto x = random_floats(s.x_size(), 9);
    if (s.planes == 1) x = {1, 3, nan, 5, -INFINITY, -INFINITY, 1, 3, nan, 2, -INFINITY, -INFINITY};
    std::vector<float> y(s.y_size());
    std::vector<std::int32_t> argmax(s.y_size(), -1);
    Dev<float> gx(x), gy(y);
    Dev<std::int32_t> garg(argmax);
    gpu::maxpool_forward(gx.ptr, gy.ptr, garg.ptr, s, nullptr);
    cpu::maxpool_forward(x.data(), y.data(), argmax.data(), s);
    const auto gpu_y = gy.get();
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("output " << i);
      REQUIRE((gpu_y[i] == y[i] || (std::isnan(gpu_y[i]) && std::isnan(y[i]))));
    }
    CHECK(garg.get() == argmax);

    const auto dy = random_floats(s.y_size(), 10);
    std::vector<float> dx(s.x_size(), 99.0f);
    Dev<float> gdy(dy), gdx(dx);
    gpu::maxpool_backward(gdy.ptr, garg.ptr, gdx.ptr, s, nullptr);
    cpu::maxpool_backward(dy.data(), argmax.data(), dx.data(), s);
    CHECK(gdx.get() == dx);
  }
}

TEST_CASE("dropout draws the CPU's mask for the same (seed, offset), forward and backward",
          "[gpu][kernels][conv]") {
  for (std::size_t n :
       {std::size_t{1}, std::size_t{255}, std::size_t{4 * 9216}, std::size_t{1} << 20}) {
    for (float p : {0.0f, 0.25f, 0.5f, 1.0f}) {
      CAPTURE(n, p);
      const auto x = random_floats(n, 11);
      std::vector<float> y(n);
      std::vector<std::uint8_t> mask(n, 7);
      Dev<float> gx(x), gy(y);
      Dev<std::uint8_t> gmask(mask);
      const std::uint64_t seed = 0x5eedull, offset = 123456789ull;
      gpu::dropout_forward(gx.ptr, gy.ptr, gmask.ptr, n, p, seed, offset, nullptr);
      cpu::dropout_forward(x.data(), y.data(), mask.data(), n, p, seed, offset);
      CHECK(gmask.get() == mask);
      CHECK(gy.get() == y);

      // Backward in place on the GPU (dx = dy), from the seed alone.
      const auto dy = random_floats(n, 12);
      std::vector<float> dx(n);
      Dev<float> gd(dy);
      gpu::dropout_backward(gd.ptr, gd.ptr, n, p, seed, offset, nullptr);
      cpu::dropout_backward(dy.data(), dx.data(), n, p, seed, offset);
      CHECK(gd.get() == dx);
    }
  }
  Dev<float> one(std::vector<float>{1.0f});
  CHECK_THROWS_AS(gpu::dropout_forward(one.ptr, one.ptr, nullptr, 1, 1.5f, 1, 0, nullptr),
                  ddp::ConfigError);
}

TEST_CASE("Adadelta matches the CPU over several steps", "[gpu][kernels][conv]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1199882}}) {  // the convnet
    CAPTURE(n);
    auto p = random_floats(n, 13);
    std::vector<float> sq(n, 0.0f), acc(n, 0.0f);
    Dev<float> gp(p), gsq(sq), gacc(acc);
    float lr = 1.0f;
    for (std::uint32_t step = 0; step < 4; ++step, lr *= 0.7f) {  // StepLR's gamma
      const auto g = random_floats(n, 20 + step);
      Dev<float> gg(g);
      gpu::adadelta_step(gp.ptr, gg.ptr, gsq.ptr, gacc.ptr, n, lr, 0.9f, 1e-6f, nullptr);
      cpu::adadelta_step(p.data(), g.data(), sq.data(), acc.data(), n, lr, 0.9f, 1e-6f);
    }
    CHECK(close(gp.get(), p, 1e-5f, 1e-6f));
    CHECK(close(gsq.get(), sq, 1e-5f, 1e-9f));
    CHECK(close(gacc.get(), acc, 1e-5f, 1e-12f));
  }
}
