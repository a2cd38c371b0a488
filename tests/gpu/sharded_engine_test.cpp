// The sharded CUDA engine (cuda_sharded_engine.cpp) at every level against the CUDA engine
// (--sharding none) and the CPU sharded engine: the same model, initialisation and batches give
// the same losses, parameters and optimizer state step after step (fp32 within engine_test's
// tolerances), without a communicator and with a one-rank NCCL one (the collective thread and
// NCCL's gathers and reduce-scatters on one GPU), with gradient accumulation, without prefetch,
// and for a one-layer model; bf16 products stay close to fp32; upload() restores a downloaded
// shard and optimizer state. With 2 GPUs, 2 ranks (threads) of each level equal 2 ranks of the
// CUDA engine's DDP. GPU only (skipped visibly without one).
#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/random_floats.hpp"
#include "support/comm_job.hpp"
#include "support/ranks.hpp"
#include "support/skip.hpp"
#include "ddp/kernels/device.hpp"
#include "ddp/worker/comm.hpp"
#include "engine.hpp"
#include "snapshot.hpp"

using namespace ddp::train;

namespace {

constexpr Sharding kLevels[] = {Sharding::optimizer, Sharding::gradients, Sharding::full};
constexpr int kSteps = 4;
constexpr std::size_t kRows = 48;  // not a multiple of 32

// kSteps optimizer steps of `accum` micro-batches (seeded by `seed`); the step losses.
std::vector<double> train(Engine& e, int accum, std::uint32_t seed) {
  const std::size_t in = e.model().spec().layers.front().in;
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    for (int m = 0; m < accum; ++m) {
      const Batch b = random_batch(kRows, in, seed + static_cast<std::uint32_t>(step * 10 + m));
      const float scale = 1.0f / static_cast<float>(kRows * static_cast<std::size_t>(accum));
      e.micro_batch(b.x.data(), b.labels.data(), b.x.data(), kRows, scale, m + 1 == accum);
    }
    losses.push_back(e.step());
  }
  return losses;
}

// A replicated engine initialised as Model::init(7), and a sharded one the way checkpoint.cpp
// initialises shards (init_slice, then upload()).
void init_whole(Engine& e) {
  e.model().init(7);
  e.upload();
}
void init_shard(Engine& e) {
  const ShardLayout& s = *e.shard_layout();
  float* shard = e.shard_params();
  for (std::size_t k = 0; k < s.slots.size(); ++k) {
    init_slice(e.model().spec(), 7, k, s.lo[k], s.hi[k], shard + s.local[k]);
  }
  e.upload();
}

double max_abs_diff(const float* a, const float* b, std::size_t n) {
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

// A shard (pieces of shard_size floats: parameters, or each optimizer state array) against the
// same pieces of a whole (pieces of `total` floats), through the layout.
double shard_vs_whole(const ShardLayout& s, const float* shard, const float* whole,
                      std::size_t pieces) {
  double worst = 0.0;
  for (std::size_t j = 0; j < pieces; ++j) {
    for (std::size_t k = 0; k < s.slots.size(); ++k) {
      worst =
          std::max(worst, max_abs_diff(shard + j * s.shard_size + s.local[k],
                                       whole + j * s.total + s.slots[k].w + s.lo[k], s.part(k)));
    }
  }
  return worst;
}

std::size_t pieces_of(Engine& e) {
  const std::size_t shard = e.shard_layout()->shard_size;
  return shard == 0 ? 0 : e.optimizer().state().size() / shard;
}

std::vector<float> output(Engine& e, std::uint32_t seed) {
  const std::size_t in = e.model().spec().layers.front().in;
  const Batch b = random_batch(kRows, in, seed);
  const float* y = e.predict(b.x.data(), kRows);
  return std::vector<float>(y, y + kRows * e.model().spec().layers.back().out);
}

bool close_losses(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > tol * std::max(1.0, std::abs(b[i]))) return false;
  }
  return true;
}

// Every level of the sharded CUDA engine against the CUDA engine and the CPU sharded engine.
void compare(const std::string& model, OptimizerConfig opt, int accum, bool prefetch,
             ddp::worker::Communicator* comm) {
  CAPTURE(model, to_string(opt.kind), accum, prefetch, comm != nullptr);
  CudaEngineOptions co;
  co.max_rows = 64;
  auto none = make_cuda_engine(model_spec(model), opt, nullptr, co);
  init_whole(*none);
  const std::vector<double> ln = train(*none, accum, 0);
  none->download();
  const std::vector<float> yn = output(*none, 99);
  // Adam moves each parameter by about lr whatever the gradient's size, so a gradient within
  // rounding of zero can flip a step between two summation orders: allow 2 lr there.
  const double tol = opt.kind == OptimizerKind::adam ? 2.0 * opt.lr : 1e-4;
  for (Sharding level : kLevels) {
    CAPTURE(to_string(level));
    auto gpu = make_cuda_sharded_engine(model_spec(model), opt, comm, level, prefetch, co);
    auto cpu = make_sharded_engine(model_spec(model), opt, nullptr, level, prefetch, 25.0);
    REQUIRE(gpu->sharding() == level);
    REQUIRE(gpu->shard_layout() != nullptr);
    CHECK_FALSE(gpu->collective_predict());  // one rank
    init_shard(*gpu);
    init_shard(*cpu);
    const std::vector<double> lg = train(*gpu, accum, 0);
    const std::vector<double> lc = train(*cpu, accum, 0);
    CHECK(close_losses(lg, ln, 1e-4));
    CHECK(close_losses(lg, lc, 1e-4));
    gpu->download();
    cpu->download();
    const ShardLayout& s = *gpu->shard_layout();
    CHECK(s.shard_size == s.total);
    CHECK(shard_vs_whole(s, gpu->shard_params(), none->model().params().data(), 1) < tol);
    CHECK(max_abs_diff(gpu->shard_params(), cpu->shard_params(), s.shard_size) < tol);
    CHECK(shard_vs_whole(s, gpu->optimizer().state().data(), none->optimizer().state().data(),
                         pieces_of(*gpu)) < tol);
    CHECK(gpu->optimizer().steps() == kSteps);
    CHECK(max_abs_diff(output(*gpu, 99).data(), yn.data(), yn.size()) < 1e-4);
    // One rank: the shard is the whole model in the flat layout.
    CHECK(gpu->param_checksum() == fnv1a64(gpu->shard_params(), s.shard_size * sizeof(float)));
    CHECK(gpu->state_bytes_peak() > 0);
  }
}

}  // namespace

TEST_CASE("sharded CUDA engine = CUDA engine = CPU sharded engine, every level, fp32",
          "[gpu][engine][sharding]") {
  compare("mlp", {OptimizerKind::sgd, 0.05f, 0.9f}, 1, true, nullptr);
  compare("mlp", {OptimizerKind::adam, 1e-3f}, 1, true, nullptr);
  compare("mlp", {OptimizerKind::sgd, 0.05f}, 3, true, nullptr);         // gradient accumulation
  compare("mlp", {OptimizerKind::sgd, 0.05f, 0.9f}, 1, false, nullptr);  // no prefetch
  compare("autoencoder", {OptimizerKind::adam, 1e-3f}, 1, true, nullptr);
  compare("linear", {OptimizerKind::sgd, 0.05f}, 2, true, nullptr);  // one layer, kept
}

TEST_CASE("sharded CUDA engine over a one-rank NCCL communicator (the collective path)",
          "[gpu][engine][sharding]") {
  ddp::test::CommJob job;
  auto comm = ddp::worker::make_nccl_communicator(job.options(0, 1, "sharded1"), 0);
  compare("mlp", {OptimizerKind::sgd, 0.05f, 0.9f}, 1, true, comm.get());
  compare("mlp", {OptimizerKind::adam, 1e-3f}, 2, true, comm.get());
  compare("mlp", {OptimizerKind::sgd, 0.05f}, 1, false, comm.get());
  compare("linear", {OptimizerKind::sgd, 0.05f}, 1, true, comm.get());
}

TEST_CASE("sharded CUDA engine, bf16 products with fp32 master shards, stays close to fp32",
          "[gpu][engine][sharding]") {
  const OptimizerConfig opt{OptimizerKind::adam, 1e-3f};
  auto cpu = make_sharded_engine(model_spec("mlp"), opt, nullptr, Sharding::full, true, 25.0);
  init_shard(*cpu);
  const std::vector<double> lc = train(*cpu, 1, 0);
  CudaEngineOptions co;
  co.max_rows = 64;
  co.precision = Precision::bf16;
  auto none16 = make_cuda_engine(model_spec("mlp"), opt, nullptr, co);
  init_whole(*none16);
  const std::vector<double> ln = train(*none16, 1, 0);
  none16->download();
  for (Sharding level : kLevels) {
    CAPTURE(to_string(level));
    auto gpu = make_cuda_sharded_engine(model_spec("mlp"), opt, nullptr, level, true, co);
    init_shard(*gpu);
    const std::vector<double> lg = train(*gpu, 1, 0);
    CHECK(close_losses(lg, lc, 3e-2));
    CHECK(close_losses(lg, ln, 1e-2));  // the same bf16 products as the CUDA engine's
    gpu->download();
    const ShardLayout& s = *gpu->shard_layout();
    CHECK(max_abs_diff(gpu->shard_params(), cpu->shard_params(), s.shard_size) < 5e-2);
    CHECK(shard_vs_whole(s, gpu->shard_params(), none16->model().params().data(), 1) < 2e-2);
  }
}

TEST_CASE("sharded CUDA engine: upload() restores a downloaded shard and optimizer state",
          "[gpu][engine][sharding]") {
  const OptimizerConfig opt{OptimizerKind::adam, 1e-3f};
  CudaEngineOptions co;
  co.max_rows = 64;
  for (Sharding level : kLevels) {
    CAPTURE(to_string(level));
    auto a = make_cuda_sharded_engine(model_spec("mlp"), opt, nullptr, level, true, co);
    init_shard(*a);
    train(*a, 1, 0);
    a->download();
    auto b = make_cuda_sharded_engine(model_spec("mlp"), opt, nullptr, level, true, co);
    const std::size_t n = b->shard_layout()->shard_size;
    std::copy_n(a->shard_params(), n, b->shard_params());
    b->optimizer().state() = a->optimizer().state();
    b->optimizer().set_steps(a->optimizer().steps());
    b->upload();
    CHECK(b->param_checksum() == a->param_checksum());
    const std::vector<double> la = train(*a, 1, 100);
    const std::vector<double> lb = train(*b, 1, 100);
    CHECK(close_losses(la, lb, 1e-6));
    a->download();
    b->download();
    CHECK(max_abs_diff(a->shard_params(), b->shard_params(), n) < 1e-6);
  }
}

TEST_CASE("a batch larger than the sharded CUDA engine was sized for is refused",
          "[gpu][engine][sharding]") {
  CudaEngineOptions co;
  co.max_rows = 8;
  auto gpu = make_cuda_sharded_engine(model_spec("linear"), {OptimizerKind::sgd, 0.1f}, nullptr,
                                      Sharding::full, true, co);
  std::vector<float> x(9 * 20, 0.5f);
  CHECK_THROWS_WITH(gpu->micro_batch(x.data(), nullptr, x.data(), 9, 1.0f, true),
                    Catch::Contains("9 rows"));
}

TEST_CASE("2 GPUs: each sharding level over NCCL equals the CUDA engine's DDP",
          "[gpu][engine][sharding]") {
  if (ddp::kernels::cuda_device_count() < 2) {
    DDP_SKIP("fewer than 2 CUDA devices: the 2-rank NCCL sharding test did not run");
  }
  const OptimizerConfig opt{OptimizerKind::adam, 1e-3f};
  struct Rank {
    std::vector<float> whole;  // the CUDA engine's parameters
    std::vector<double> ln;
    std::vector<float> yn;
    ShardLayout layout[3];
    std::vector<float> shard[3];
    std::vector<double> ls[3];
    std::vector<float> ys[3];
    std::uint64_t checksum[3] = {0, 0, 0};
    bool collective[3] = {false, false, false};
  };
  std::vector<Rank> out(2);
  ddp::test::CommJob job(std::chrono::seconds(60));
  ddp::test::run_ranks(2, [&](int r) {
    auto comm = ddp::worker::make_nccl_communicator(job.options(r, 2, "sharded2"), r);
    Rank& o = out[static_cast<std::size_t>(r)];
    CudaEngineOptions co;
    co.device = r;
    co.max_rows = 64;
    const auto seed = static_cast<std::uint32_t>(1000 * r);  // each rank its own batches
    {
      auto none = make_cuda_engine(model_spec("mlp"), opt, comm.get(), co);
      init_whole(*none);
      o.ln = train(*none, 2, seed);
      none->download();
      o.whole = none->model().params();
      o.yn = output(*none, 99);
    }
    for (std::size_t i = 0; i < 3; ++i) {
      auto e = make_cuda_sharded_engine(model_spec("mlp"), opt, comm.get(), kLevels[i], true, co);
      init_shard(*e);
      o.ls[i] = train(*e, 2, seed);
      o.collective[i] = e->collective_predict();
      o.ys[i] = output(*e, 99);  // collective at full: both ranks evaluate
      o.checksum[i] = e->param_checksum();
      e->download();
      o.layout[i] = *e->shard_layout();
      o.shard[i].assign(e->shard_params(), e->shard_params() + o.layout[i].shard_size);
    }
  });
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(to_string(kLevels[i]));
    std::vector<float> whole(out[0].whole.size(), -1.0f);  // the shards put together
    for (std::size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      const Rank& o = out[r];
      const ShardLayout& s = o.layout[i];
      CHECK(s.world == 2);
      CHECK(close_losses(o.ls[i], o.ln, 1e-4));
      CHECK(shard_vs_whole(s, o.shard[i].data(), o.whole.data(), 1) < 2.0 * opt.lr);
      CHECK(max_abs_diff(o.ys[i].data(), o.yn.data(), o.yn.size()) < 1e-3);
      CHECK(o.collective[i] == (kLevels[i] == Sharding::full));
      for (std::size_t k = 0; k < s.slots.size(); ++k) {
        std::copy_n(o.shard[i].data() + s.local[k], s.part(k),
                    whole.data() + s.slots[k].w + s.lo[k]);
      }
    }
    CHECK(out[0].checksum[i] == out[1].checksum[i]);
    CHECK(out[0].checksum[i] == fnv1a64(whole.data(), whole.size() * sizeof(float)));
  }
}
