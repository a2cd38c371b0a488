// The CUDA engine against the CPU engine: the same model, initialisation and batches give the
// same losses and parameters step after step (fp32 within 1e-4; bf16 products within a few
// percent), for SGD with momentum and Adam, with gradient accumulation, and snapshots' host
// copies round-trip through upload/download. GPU only (skipped visibly without one).
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "support/random_floats.hpp"
#include "engine.hpp"

using namespace ddp::train;

namespace {

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

void compare(const std::string& model, OptimizerConfig opt, bool bf16, int accum) {
  CAPTURE(model, to_string(opt.kind), bf16, accum);
  auto cpu = make_cpu_engine(model_spec(model), opt, nullptr, 25.0);
  CudaEngineOptions co;
  co.max_rows = 64;
  co.precision = bf16 ? Precision::bf16 : Precision::fp32;
  auto gpu = make_cuda_engine(model_spec(model), opt, nullptr, co);
  cpu->model().init(7);
  gpu->model().init(7);
  gpu->upload();
  const std::size_t rows = 48;  // not a multiple of 32
  const std::size_t in = cpu->model().spec().layers.front().in;
  const double loss_tol = bf16 ? 3e-2 : 1e-4;
  for (int step = 0; step < 5; ++step) {
    for (int m = 0; m < accum; ++m) {
      const Batch b = random_batch(rows, in, static_cast<std::uint32_t>(step * 10 + m));
      const float scale = 1.0f / static_cast<float>(rows * static_cast<std::size_t>(accum));
      const bool sync = m + 1 == accum;
      cpu->micro_batch(b.x.data(), b.labels.data(), b.x.data(), rows, scale, sync);
      gpu->micro_batch(b.x.data(), b.labels.data(), b.x.data(), rows, scale, sync);
    }
    const double lc = cpu->step();
    const double lg = gpu->step();
    CAPTURE(step, lc, lg);
    CHECK(std::abs(lc - lg) <= loss_tol * std::max(1.0, std::abs(lc)));
  }
  gpu->download();
  // Adam moves each parameter by about lr whatever the gradient's size, so a gradient within
  // rounding of zero can flip a step between cuBLAS and OpenBLAS: allow 2 lr there.
  const double param_tol = bf16 ? 5e-2 : opt.kind == OptimizerKind::adam ? 2.0 * opt.lr : 1e-4;
  CHECK(max_abs_diff(gpu->model().params(), cpu->model().params()) < param_tol);
  CHECK(gpu->optimizer().steps() == 5);
  // predict agrees too
  const Batch b = random_batch(rows, in, 99);
  const float* yc = cpu->predict(b.x.data(), rows);
  std::vector<float> c(yc, yc + rows * cpu->model().spec().layers.back().out);
  const float* yg = gpu->predict(b.x.data(), rows);
  std::vector<float> g(yg, yg + c.size());
  CHECK(max_abs_diff(g, c) < (bf16 ? 1e-1 : 1e-4));
}

}  // namespace

TEST_CASE("CUDA engine = CPU engine, fp32: mlp with SGD momentum and Adam, autoencoder",
          "[gpu][engine]") {
  compare("mlp", {OptimizerKind::sgd, 0.05f, 0.9f}, false, 1);
  compare("mlp", {OptimizerKind::adam, 1e-3f}, false, 1);
  compare("mlp", {OptimizerKind::sgd, 0.05f}, false, 3);  // gradient accumulation
  compare("autoencoder", {OptimizerKind::adam, 1e-3f}, false, 1);
}

TEST_CASE("CUDA engine, bf16 products with fp32 master weights, stays close to fp32",
          "[gpu][engine]") {
  compare("mlp", {OptimizerKind::adam, 1e-3f}, true, 1);
}

TEST_CASE("a batch larger than the engine was sized for is refused", "[gpu][engine]") {
  CudaEngineOptions co;
  co.max_rows = 8;
  auto gpu = make_cuda_engine(model_spec("linear"), {OptimizerKind::sgd, 0.1f}, nullptr, co);
  std::vector<float> x(9 * 20, 0.5f), t(9, 0.5f);
  CHECK_THROWS_WITH(gpu->micro_batch(x.data(), nullptr, t.data(), 9, 1.0f, true),
                    Catch::Contains("9 rows"));
}
