// The membership of in-place recovery (ddp/worker/membership.hpp) over a real store server and
// real Gloo communicators, ranks as threads: a replacement and the survivors meet in the next
// generation; the agent's peer_lost line stops the device communicator's waits until that
// generation forms; each generation's NCCL communicator bootstraps under its own prefix (a fake
// device factory stands for NCCL, which needs GPUs).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/proto/regroup.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/membership.hpp"
#include "ddp/worker/progress.hpp"
#include "support/comm_job.hpp"
#include "support/ranks.hpp"
#include "support/store_fixture.hpp"

using namespace ddp;

namespace {

struct Store : test::ServerFixture {
  Store()
      : ServerFixture([] {
          rdzv::ServerOptions o;
          o.threads = 2;
          return o;
        }()) {}

  worker::MembershipConfig config(int rank, int world) {
    worker::MembershipConfig c;
    c.env.rank = rank;
    c.env.world_size = world;
    c.env.local_rank = rank;
    c.env.local_world_size = world;
    c.env.master_addr = "127.0.0.1";
    c.env.master_port = server.port();
    c.env.use_agent_store = true;
    c.comm.timeout = std::chrono::seconds(20);
    c.in_place = true;
    c.shm_allreduce = false;
    return c;
  }
};

// The device communicator a fake factory makes: it remembers its options.
class FakeDevice final : public worker::Communicator {
 public:
  explicit FakeDevice(worker::CommOptions o) : o_(std::move(o)) {}
  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  const char* backend() const override { return "fake"; }
  void all_reduce_sum(float*, std::size_t) override {}
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  void all_gather(const void*, void*, std::size_t) override {}
  void reduce_scatter_sum(const float*, float*, const std::vector<std::size_t>&) override {}
  void all_gather_v(const float*, float*, const std::vector<std::size_t>&) override {}
  const worker::CommOptions& options() const { return o_; }

 private:
  worker::CommOptions o_;
};

struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { REQUIRE(::pipe(fds) == 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void write(const std::string& s) const {
    REQUIRE(::write(fds[1], s.data(), s.size()) == static_cast<ssize_t>(s.size()));
  }
};

}  // namespace

TEST_CASE("membership: the survivors and a dead rank's replacement meet in the next generation",
          "[integration][membership]") {
  Store store;
  std::vector<int> gens(3, -1);
  std::vector<float> sums(3, 0.0f);
  test::run_ranks(3, [&](int r) {
    auto m = std::make_unique<worker::Membership>(store.config(r, 3));
    float one = 1.0f;
    m->connect()->all_reduce_sum(&one, 1);
    test::expect(one == 3.0f, "generation 0 sums over 3 ranks");
    if (r == 2) {  // dies: its communicator closes, then a replacement starts (DDPRUN_HEAL=1)
      m.reset();
      m = std::make_unique<worker::Membership>(store.config(r, 3));
      m->skip_joined_generations();
      m->connect();
    } else {
      m->reconnect();
    }
    float v = static_cast<float>(r + 1);
    m->comm()->all_reduce_sum(&v, 1);
    gens[static_cast<std::size_t>(r)] = m->generation();
    sums[static_cast<std::size_t>(r)] = v;
  });
  CHECK(gens == std::vector<int>{1, 1, 1});
  CHECK(sums == std::vector<float>{6.0f, 6.0f, 6.0f});
}

TEST_CASE("membership: a peer_lost line stops the device waits until the next generation forms",
          "[integration][membership]") {
  Store store;
  Pipe control;
  worker::ProgressWriter progress;
  std::string why;
  REQUIRE(progress.listen(control.fds[0], &why));
  auto c = store.config(0, 1);
  c.progress = &progress;
  std::vector<const FakeDevice*> made;
  c.make_device = [&](const worker::CommOptions& o, int device) {
    CHECK(device == 3);
    auto d = std::make_unique<FakeDevice>(o);
    made.push_back(d.get());
    return std::unique_ptr<worker::Communicator>(std::move(d));
  };
  worker::Membership m(std::move(c));
  m.connect();
  m.connect_device(3);
  REQUIRE(made.size() == 1);
  const std::string base = m.env().store_prefix() + "/ddp_train";
  CHECK(made[0]->options().key_prefix == base + "/nccl");
  REQUIRE(made[0]->options().interrupted);
  CHECK_FALSE(made[0]->options().interrupted());

  control.write("colour=red\n");  // not an agent line: ignored with a warning
  CHECK_FALSE(made[0]->options().interrupted());
  control.write(format_peer_lost({1, 1}));
  CHECK(made[0]->options().interrupted());
  CHECK(m.peer_lost());

  m.reconnect();  // generation 1 forms (every member came): the loss is healed
  CHECK(m.generation() == 1);
  CHECK_FALSE(m.peer_lost());
  m.connect_device(3);
  REQUIRE(made.size() == 2);
  CHECK(made[1]->options().key_prefix == base + "/g1/nccl");
  CHECK_FALSE(made[1]->options().interrupted());
}

TEST_CASE("membership: a worker that does not recover in place gets no interruption",
          "[integration][membership]") {
  Store store;
  auto c = store.config(0, 1);
  c.in_place = false;
  worker::CommOptions seen;
  c.make_device = [&](const worker::CommOptions& o, int) {
    seen = o;
    return std::unique_ptr<worker::Communicator>(std::make_unique<FakeDevice>(o));
  };
  worker::Membership m(std::move(c));
  m.connect();
  m.connect_device(0);
  CHECK_FALSE(seen.interrupted);
  CHECK(worker::generation_prefix("/p/ddp_train", 0) == "/p/ddp_train");
  CHECK(worker::generation_prefix("/p/ddp_train", 4) == "/p/ddp_train/g4");
}
