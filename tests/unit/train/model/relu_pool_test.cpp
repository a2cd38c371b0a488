// The fused ReLU + 2x2 max-pool + dropout (relu_pool.hpp) against the three reference passes it
// replaces (cpu::relu_forward, maxpool_forward, dropout_forward and their backwards), bit for
// bit: outputs, argmax choices and input gradients, with ties, all-negative windows, NaN, odd
// sizes, dropout on and off, and the planes cut into ranges as the trainer's threads cut them.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ddp/kernels/conv_ref.hpp"
#include "ddp/kernels/cpu_ref.hpp"
#include "relu_pool.hpp"
#include "support/random_floats.hpp"

namespace cpu = ddp::kernels::cpu;
using ddp::kernels::PoolShape;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Inputs with ties, zeros and windows of negatives only (their output is 0 and their gradient
// is dropped), besides plain random values.
std::vector<float> tricky_input(std::size_t n, std::uint32_t seed) {
  std::vector<float> z = random_floats(n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 7 == 0) z[i] = 0.5f;   // ties across a window
    if (i % 11 == 0) z[i] = 0.0f;  // ReLU's boundary
    if (i % 13 == 0) z[i] = -0.0f;
  }
  return z;
}

struct Pass {
  std::vector<float> y, dz;
  std::vector<std::int32_t> argmax;
};

Pass reference(std::vector<float> z, const std::vector<float>& dy, const PoolShape& s, float p,
               std::uint64_t seed) {
  Pass r;
  cpu::relu_forward(z.data(), z.size());
  r.y.resize(s.y_size());
  r.argmax.resize(s.y_size());
  cpu::maxpool_forward(z.data(), r.y.data(), r.argmax.data(), s);
  if (p > 0.0f) cpu::dropout_forward(r.y.data(), r.y.data(), nullptr, r.y.size(), p, seed, 0);
  std::vector<float> d = dy;
  if (p > 0.0f) cpu::dropout_backward(d.data(), d.data(), d.size(), p, seed, 0);
  r.dz.resize(s.x_size());
  cpu::maxpool_backward(d.data(), r.argmax.data(), r.dz.data(), s);
  cpu::relu_backward(r.dz.data(), z.data(), z.size());
  return r;
}

// The fused pass, its planes cut into `parts` ranges (each with its own offset), as
// parallel_ranges cuts them.
Pass fused(const std::vector<float>& z, const std::vector<float>& dy, const PoolShape& s, float p,
           std::uint64_t seed, std::size_t parts) {
  Pass f;
  f.y.assign(s.y_size(), -7.0f);
  f.argmax.assign(s.y_size(), -1);
  f.dz.assign(s.x_size(), -7.0f);
  const std::size_t in_plane = s.in_h * s.in_w, out_plane = s.out_h() * s.out_w();
  const float scale = p > 0.0f ? ddp::kernels::dropout_scale(p) : 1.0f;
  for (std::size_t t = 0; t < parts; ++t) {
    const std::size_t lo = s.planes * t / parts, hi = s.planes * (t + 1) / parts;
    const PoolShape part{hi - lo, s.in_h, s.in_w, 2};
    if (part.planes == 0) continue;
    ddp::train::relu_maxpool2_dropout_forward(z.data() + lo * in_plane, f.y.data() + lo * out_plane,
                                              f.argmax.data() + lo * out_plane, part, p, seed,
                                              lo * out_plane);
    ddp::train::relu_maxpool2_dropout_backward(
        dy.data() + lo * out_plane, f.y.data() + lo * out_plane, f.argmax.data() + lo * out_plane,
        f.dz.data() + lo * in_plane, part, scale, p > 0.0f);
  }
  return f;
}

}  // namespace

TEST_CASE("fused relu + 2x2 max-pool + dropout: the references' bits, cut any way",
          "[unit][train]") {
  const PoolShape shapes[] = {{3, 24, 24, 2}, {5, 7, 9, 2}, {1, 2, 2, 2}, {4, 26, 25, 2}};
  const float ps[] = {0.0f, 0.25f, 0.5f};
  std::uint32_t seed = 1;
  for (const auto& s : shapes) {
    for (float p : ps) {
      for (std::size_t parts : {1, 2, 3}) {
        ++seed;
        INFO("planes " << s.planes << ", " << s.in_h << "x" << s.in_w << ", p " << p << ", "
                       << parts << " ranges");
        const auto z = tricky_input(s.x_size(), seed);
        const auto dy = random_floats(s.y_size(), seed + 1000);
        const Pass ref = reference(z, dy, s, p, 77 + seed);
        const Pass got = fused(z, dy, s, p, 77 + seed, parts);
        CHECK(same_bits(got.y, ref.y));
        CHECK(got.argmax == ref.argmax);
        CHECK(same_bits(got.dz, ref.dz));
      }
    }
  }
}

TEST_CASE("fused relu + max-pool: NaN becomes 0 as the ReLU makes it, and only 2x2 is taken",
          "[unit][train]") {
  const PoolShape s{1, 2, 4, 2};
  const std::vector<float> z = {NAN, -1.0f, 3.0f, NAN, 2.0f, -2.0f, 3.0f, 1.0f};
  const std::vector<float> dy = {1.0f, 1.0f};
  const Pass ref = reference(z, dy, s, 0.0f, 1);
  const Pass got = fused(z, dy, s, 0.0f, 1, 1);
  CHECK(same_bits(got.y, ref.y));
  CHECK(got.argmax == ref.argmax);
  CHECK(same_bits(got.dz, ref.dz));
  CHECK(got.y == std::vector<float>{2.0f, 3.0f});
  std::vector<float> y(1);
  std::vector<std::int32_t> am(1);
  CHECK_THROWS_WITH(ddp::train::relu_maxpool2_dropout_forward(z.data(), y.data(), am.data(),
                                                              PoolShape{1, 6, 6, 3}, 0.0f, 1, 0),
                    Catch::Contains("2x2 pool only"));
}
