// The transformer's CUDA kernels (lm_ops.hpp) against their CPU references (lm_ref.hpp) on
// random inputs, at sizes that are and are not multiples of the warp and block sizes (vocab 256,
// 1000 and larger). Runs only with a GPU (gpu_main.cpp exits 77, a visible skip, without one).
// Tolerances: the embedding equals the CPU bit for bit (same order of additions); element-wise
// results within 1e-5 relative (expf may differ by an ulp or two); reductions, whose order
// differs, within 1e-4 relative; RoPE within 1e-4 absolute (the device's powf is within 4 ulps,
// times positions up to 100). Every kernel is deterministic: backward passes repeat bit for bit.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "support/random_floats.hpp"
#include "ddp/kernels/lm_ops.hpp"
#include "ddp/kernels/lm_ref.hpp"
#include "ddp/proto/error.hpp"

namespace cpu = ddp::kernels::cpu;
namespace gpu = ddp::kernels::cuda;

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

// Uniform in [lo, hi) from a seed.
std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo, float hi) {
  auto v = random_floats(n, seed);  // [-1, 1)
  for (auto& x : v) x = lo + (x + 1.0f) * 0.5f * (hi - lo);
  return v;
}

std::vector<std::int32_t> random_tokens(std::size_t n, std::size_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % vocab);
  return t;
}

// batch, seq, heads, head_dim (even: RoPE needs pairs).
struct Shape {
  std::size_t batch, seq, heads, head_dim;
  std::size_t rows() const { return batch * seq; }
  std::size_t size() const { return batch * seq * heads * head_dim; }
  std::size_t att_size() const { return batch * heads * seq * seq; }
};

const Shape kShapes[] = {
    {1, 1, 1, 2},                     // one token
    {2, 7, 3, 6},                     // small, odd counts
    {1, 33, 2, 64},                   // seq just past a warp, a LLaMA head size
    {2, 65, 1, 24},                   // seq just past two warps
    {1, 100, 4, 10}, {3, 17, 2, 34},  // head_dim just past a warp
};

}  // namespace

TEST_CASE("embedding forward and backward equal the CPU bit for bit", "[gpu][kernels][lm]") {
  for (std::size_t vocab : {std::size_t{256}, std::size_t{1000}}) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{31}, std::size_t{257}, std::size_t{600}}) {
      for (std::size_t dim : {std::size_t{1}, std::size_t{33}, std::size_t{300}}) {
        CAPTURE(vocab, rows, dim);
        const auto tokens = random_tokens(rows, vocab, 1);
        const auto table = random_floats(vocab * dim, 2);
        std::vector<float> out(rows * dim, 99.0f);
        Dev<std::int32_t> gtok(tokens);
        Dev<float> gtable(table), gout(out);
        gpu::embedding_forward(gtok.ptr, gtable.ptr, gout.ptr, rows, dim, nullptr);
        cpu::embedding_forward(tokens.data(), table.data(), out.data(), rows, dim);
        CHECK(gout.get() == out);

        const auto dout = random_floats(rows * dim, 3);
        auto dtable = random_floats(vocab * dim, 4);  // += onto
        Dev<float> gdout(dout), gdtable(dtable);
        gpu::embedding_backward(gtok.ptr, gdout.ptr, gdtable.ptr, rows, dim, vocab, nullptr);
        cpu::embedding_backward(tokens.data(), dout.data(), dtable.data(), rows, dim);
        CHECK(gdtable.get() == dtable);
      }
    }
  }
}

TEST_CASE("RMSNorm forward and backward match the CPU", "[gpu][kernels][lm]") {
  for (std::size_t rows : {std::size_t{1}, std::size_t{31}, std::size_t{257}}) {
    for (std::size_t dim : {std::size_t{1}, std::size_t{33}, std::size_t{256}, std::size_t{300}}) {
      CAPTURE(rows, dim);
      const float eps = 1e-5f;
      const auto x = random_floats(rows * dim, 5);
      const auto w = uniform(dim, 6, 0.5f, 1.5f);
      std::vector<float> y(rows * dim), rstd(rows);
      Dev<float> gx(x), gw(w), gy(y), grstd(rstd);
      gpu::rmsnorm_forward(gx.ptr, gw.ptr, gy.ptr, grstd.ptr, rows, dim, eps, nullptr);
      cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, eps);
      CHECK(close(grstd.get(), rstd, 1e-4f, 1e-6f));
      CHECK(close(gy.get(), y, 1e-4f, 1e-5f));

      const auto dy = random_floats(rows * dim, 7);
      std::vector<float> dx(rows * dim, 99.0f);  // overwritten
      auto dw = random_floats(dim, 8);           // += onto
      const auto dw0 = dw;
      Dev<float> gdy(dy), gdx(dx), gdw(dw);
      // Both sides from the CPU's rstd, so only the backward's own arithmetic is compared.
      Dev<float> crstd(rstd);
      gpu::rmsnorm_backward(gdy.ptr, gx.ptr, gw.ptr, crstd.ptr, gdx.ptr, gdw.ptr, rows, dim,
                            nullptr);
      cpu::rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows,
                            dim);
      CHECK(close(gdx.get(), dx, 1e-4f, 1e-4f));
      CHECK(close(gdw.get(), dw, 1e-4f, 1e-4f));  // sums of up to 257 terms of size ~1

      Dev<float> again(dw0);
      gpu::rmsnorm_backward(gdy.ptr, gx.ptr, gw.ptr, crstd.ptr, gdx.ptr, again.ptr, rows, dim,
                            nullptr);
      CHECK(again.get() == gdw.get());  // the same order of additions every time
    }
  }
}

TEST_CASE("RoPE forward and backward match the CPU and undo each other", "[gpu][kernels][lm]") {
  for (const Shape& s : kShapes) {
    for (float theta : {10000.0f, 500000.0f}) {
      CAPTURE(s.batch, s.seq, s.heads, s.head_dim, theta);
      const auto x0 = random_floats(s.size(), 9);
      auto x = x0;
      Dev<float> gx(x);
      gpu::rope_forward(gx.ptr, s.rows(), s.seq, s.heads, s.head_dim, theta, nullptr);
      cpu::rope_forward(x.data(), s.rows(), s.seq, s.heads, s.head_dim, theta);
      CHECK(close(gx.get(), x, 1e-5f, 1e-4f));

      auto dx = random_floats(s.size(), 10);
      Dev<float> gdx(dx);
      gpu::rope_backward(gdx.ptr, s.rows(), s.seq, s.heads, s.head_dim, theta, nullptr);
      cpu::rope_backward(dx.data(), s.rows(), s.seq, s.heads, s.head_dim, theta);
      CHECK(close(gdx.get(), dx, 1e-5f, 1e-4f));

      // Backward is the inverse rotation: forward then backward gives x back (up to rounding).
      gpu::rope_backward(gx.ptr, s.rows(), s.seq, s.heads, s.head_dim, theta, nullptr);
      CHECK(close(gx.get(), x0, 1e-5f, 1e-5f));
    }
  }
  Dev<float> one(std::vector<float>(6, 1.0f));
  CHECK_THROWS_AS(gpu::rope_forward(one.ptr, 1, 1, 2, 3, 10000.0f, nullptr), ddp::ConfigError);
  CHECK_THROWS_AS(gpu::rope_backward(one.ptr, 1, 1, 2, 3, 10000.0f, nullptr), ddp::ConfigError);
}

TEST_CASE("causal attention forward and backward match the CPU", "[gpu][kernels][lm]") {
  for (const Shape& s : kShapes) {
    CAPTURE(s.batch, s.seq, s.heads, s.head_dim);
    const auto q = random_floats(s.size(), 11), k = random_floats(s.size(), 12);
    const auto v = random_floats(s.size(), 13);
    std::vector<float> att(s.att_size(), 99.0f), out(s.size(), 99.0f);  // all overwritten
    Dev<float> gq(q), gk(k), gv(v), gatt(att), gout(out);
    gpu::attention_forward(gq.ptr, gk.ptr, gv.ptr, gatt.ptr, gout.ptr, s.batch, s.seq, s.heads,
                           s.head_dim, nullptr);
    cpu::attention_forward(q.data(), k.data(), v.data(), att.data(), out.data(), s.batch, s.seq,
                           s.heads, s.head_dim);
    const auto gpu_att = gatt.get();
    CHECK(close(gpu_att, att, 1e-4f, 1e-6f));  // the zeros above the diagonal exactly
    CHECK(close(gout.get(), out, 1e-4f, 1e-5f));

    // Backward from the CPU's probabilities, so only the backward's arithmetic is compared.
    const auto dout = random_floats(s.size(), 14);
    std::vector<float> dq(s.size(), 99.0f), dk(s.size(), 99.0f), dv(s.size(), 99.0f);
    Dev<float> gdout(dout), catt(att), gdq(dq), gdk(dk), gdv(dv);
    gpu::attention_backward(gdout.ptr, gq.ptr, gk.ptr, gv.ptr, catt.ptr, gdq.ptr, gdk.ptr, gdv.ptr,
                            s.batch, s.seq, s.heads, s.head_dim, nullptr);
    cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), att.data(), dq.data(),
                            dk.data(), dv.data(), s.batch, s.seq, s.heads, s.head_dim);
    const auto gpu_dq = gdq.get(), gpu_dk = gdk.get(), gpu_dv = gdv.get();
    CHECK(close(gpu_dq, dq, 1e-4f, 1e-4f));
    CHECK(close(gpu_dk, dk, 1e-4f, 1e-4f));
    CHECK(close(gpu_dv, dv, 1e-4f, 1e-4f));

    // A second run into fresh buffers repeats the first bit for bit.
    std::vector<float> junk(s.size(), -7.0f);
    Dev<float> gdq2(junk), gdk2(junk), gdv2(junk);
    gpu::attention_backward(gdout.ptr, gq.ptr, gk.ptr, gv.ptr, catt.ptr, gdq2.ptr, gdk2.ptr,
                            gdv2.ptr, s.batch, s.seq, s.heads, s.head_dim, nullptr);
    CHECK(gdq2.get() == gpu_dq);
    CHECK(gdk2.get() == gpu_dk);
    CHECK(gdv2.get() == gpu_dv);
  }
}

TEST_CASE("SwiGLU forward and backward match the CPU", "[gpu][kernels][lm]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{257}, std::size_t{100003}}) {
    CAPTURE(n);
    const auto g = uniform(n, 15, -8.0f, 8.0f), u = random_floats(n, 16);
    std::vector<float> s(n, 99.0f);
    Dev<float> gg(g), gu(u), gs(s);
    gpu::swiglu_forward(gg.ptr, gu.ptr, gs.ptr, n, nullptr);
    cpu::swiglu_forward(g.data(), u.data(), s.data(), n);
    CHECK(close(gs.get(), s, 1e-5f, 1e-6f));

    const auto ds = random_floats(n, 17);
    std::vector<float> dg(n, 99.0f), du(n, 99.0f);
    Dev<float> gds(ds), gdg(dg), gdu(du);
    gpu::swiglu_backward(gds.ptr, gg.ptr, gu.ptr, gdg.ptr, gdu.ptr, n, nullptr);
    cpu::swiglu_backward(ds.data(), g.data(), u.data(), dg.data(), du.data(), n);
    CHECK(close(gdg.get(), dg, 1e-5f, 1e-6f));  // silu' crosses 0 near g = -1.28: absolute there
    CHECK(close(gdu.get(), du, 1e-5f, 1e-6f));
  }
}

TEST_CASE("LM cross-entropy matches the CPU, losses and gradients, with and without dlogits",
          "[gpu][kernels][lm]") {
  for (std::size_t rows : {std::size_t{1}, std::size_t{31}, std::size_t{130}}) {
    for (std::size_t vocab :
         {std::size_t{1}, std::size_t{256}, std::size_t{1000}, std::size_t{50257}}) {
      CAPTURE(rows, vocab);
      const auto z = uniform(rows * vocab, 18, -8.0f, 8.0f);
      auto targets = random_tokens(rows, vocab, 19);
      targets[0] = static_cast<std::int32_t>(vocab - 1);  // the last class too
      const float scale = 1.0f / static_cast<float>(rows);
      std::vector<float> dz(z.size(), 99.0f), loss_rows(rows, 99.0f);
      Dev<float> gz(z), gdz(dz), gloss(loss_rows);
      Dev<std::int32_t> gt(targets);
      gpu::lm_cross_entropy(gz.ptr, gt.ptr, gdz.ptr, gloss.ptr, rows, vocab, scale, nullptr);
      const double cpu_loss =
          cpu::lm_cross_entropy(z.data(), targets.data(), dz.data(), rows, vocab, scale);
      double gpu_loss = 0.0;
      for (float l : gloss.get()) gpu_loss += l;
      CHECK(gpu_loss == Approx(cpu_loss).epsilon(1e-5).margin(1e-5));
      CHECK(close(gdz.get(), dz, 1e-4f, 1e-6f));

      // Evaluation: no dlogits, the same losses.
      std::vector<float> loss_eval(rows, 99.0f);
      Dev<float> geval(loss_eval);
      gpu::lm_cross_entropy(gz.ptr, gt.ptr, nullptr, geval.ptr, rows, vocab, scale, nullptr);
      CHECK(geval.get() == gloss.get());
      CHECK(cpu::lm_cross_entropy(z.data(), targets.data(), nullptr, rows, vocab, scale) ==
            Approx(cpu_loss).epsilon(1e-12));
    }
  }
}

TEST_CASE("the transformer's zero-sized calls launch nothing and are not errors",
          "[gpu][kernels][lm]") {
  CHECK_NOTHROW(gpu::embedding_forward(nullptr, nullptr, nullptr, 0, 16, nullptr));
  CHECK_NOTHROW(gpu::embedding_backward(nullptr, nullptr, nullptr, 0, 16, 256, nullptr));
  CHECK_NOTHROW(gpu::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 0, 16, 1e-5f, nullptr));
  CHECK_NOTHROW(
      gpu::rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 16, nullptr));
  CHECK_NOTHROW(gpu::rope_forward(nullptr, 0, 8, 2, 4, 10000.0f, nullptr));
  CHECK_NOTHROW(
      gpu::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, 2, 4, nullptr));
  CHECK_NOTHROW(gpu::attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        nullptr, nullptr, 2, 0, 2, 4, nullptr));
  CHECK_NOTHROW(gpu::swiglu_forward(nullptr, nullptr, nullptr, 0, nullptr));
  CHECK_NOTHROW(gpu::swiglu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr));
  CHECK_NOTHROW(gpu::lm_cross_entropy(nullptr, nullptr, nullptr, nullptr, 0, 1000, 1.0f, nullptr));
  ok(cudaDeviceSynchronize());
}
