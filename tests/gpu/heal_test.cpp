// The CUDA engine's in-place recovery (issue 34) on 2 GPUs, ranks as threads over a real store:
// rank 1 goes away between steps; rank 0's next all-reduce waits on NCCL, which cannot see the
// death, until the agent's peer_lost line (written to its control pipe here) aborts it; rank 0
// drops the step, heals into generation 1 (host and NCCL communicators), and rank 1's
// replacement takes rank 0's state over the host communicator (no disk). Afterwards both train
// in step and hold the same parameters. Skips visibly with fewer than 2 GPUs (NCCL refuses two
// ranks on one device).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/random_floats.hpp"
#include "support/ranks.hpp"
#include "support/skip.hpp"
#include "support/store_fixture.hpp"
#include "ddp/kernels/device.hpp"
#include "ddp/proto/regroup.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/worker/membership.hpp"
#include "ddp/worker/progress.hpp"
#include "checkpoint.hpp"
#include "engine.hpp"

using namespace ddp;
using namespace ddp::train;

namespace {

constexpr std::size_t kRows = 32;

worker::MembershipConfig config(int rank, std::uint16_t port) {
  worker::MembershipConfig c;
  c.env.rank = rank;
  c.env.world_size = 2;
  c.env.local_rank = rank;
  c.env.local_world_size = 2;
  c.env.master_addr = "127.0.0.1";
  c.env.master_port = port;
  c.env.use_agent_store = true;
  c.comm.timeout = std::chrono::seconds(60);
  c.in_place = true;
  c.shm_allreduce = false;
  return c;
}

std::unique_ptr<Engine> engine(worker::Membership& m, int device) {
  CudaEngineOptions co;
  co.device = device;
  co.max_rows = kRows;
  co.reconnect_device = [&m, device] { return m.connect_device(device); };
  auto e = make_cuda_engine(model_spec("mlp"), {OptimizerKind::adam, 1e-3f},
                            m.connect_device(device), co);
  return e;
}

double one_step(Engine& e, std::uint32_t seed) {
  const std::size_t in = e.model().spec().layers.front().in;
  const Batch b = random_batch(kRows, in, seed);
  e.micro_batch(b.x.data(), b.labels.data(), b.x.data(), kRows, 1.0f / kRows, true);
  return e.step();
}

}  // namespace

TEST_CASE("2 GPUs: the CUDA engine heals over a new NCCL communicator, no disk read",
          "[gpu][engine][heal]") {
  if (kernels::cuda_device_count() < 2) {
    DDP_SKIP("fewer than 2 CUDA devices: the CUDA engine's in-place heal test did not run");
  }
  test::ServerFixture store([] {
    rdzv::ServerOptions o;
    o.threads = 2;
    return o;
  }());
  int control[2] = {-1, -1};
  REQUIRE(::pipe(control) == 0);
  std::string error;
  std::vector<std::vector<float>> params(2);
  test::run_ranks(2, [&](int r) {
    worker::ProgressWriter progress;
    std::string why;
    auto c = config(r, store.server.port());
    if (r == 0) {
      if (!progress.listen(control[0], &why)) throw std::runtime_error(why);
      c.progress = &progress;
    }
    auto m = std::make_unique<worker::Membership>(std::move(c));
    m->connect();
    auto e = engine(*m, r);
    e->model().init(7);
    e->upload();
    for (std::uint32_t s = 0; s < 2; ++s) one_step(*e, 10 * s + static_cast<std::uint32_t>(r));
    Position at{0, 2, 2};
    if (r == 1) {  // goes away; its replacement starts from nothing (DDPRUN_HEAL=1)
      e.reset();
      m.reset();
      const std::string line = format_peer_lost({1, 1});  // what the agent tells rank 0
      if (::write(control[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        throw std::runtime_error("cannot write the peer_lost line");
      }
      m = std::make_unique<worker::Membership>(config(1, store.server.port()));
      m->skip_joined_generations();
      m->connect();
      e = engine(*m, 1);
      at = sync_from_peer(*e, *m->comm(), std::nullopt).at;
    } else {
      try {
        one_step(*e, 99);  // its peer is gone: aborted by the line, not the 60 s timeout
        throw std::runtime_error("the step after the peer's death did not fail");
      } catch (const NcclError& failed) {
        error = failed.what();
      }
      if (!e->heal([&] { return m->reconnect(); })) throw std::runtime_error("no heal");
      at = sync_from_peer(*e, *m->comm(), at).at;
    }
    if (at.global_step != 2) throw std::runtime_error("healed at the wrong step");
    one_step(*e, 50 + static_cast<std::uint32_t>(r));
    e->download();
    params[static_cast<std::size_t>(r)] = e->model().params();
  });
  ::close(control[0]);
  ::close(control[1]);
  CHECK_THAT(error, Catch::Contains("a peer was lost"));
  REQUIRE(params[0].size() == params[1].size());
  CHECK(params[0] == params[1]);
}
