// The Gloo communicator bootstrapped through a real StoreServer on 127.0.0.1:0, one thread per
// rank: every collective's result, the bucketed gradient reducer, a peer that goes away (an
// error, not a hang), and the store a rank-0 worker hosts when there is no agent.
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "support/ranks.hpp"
#include "support/comm_job.hpp"
#include "support/store_fixture.hpp"
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/env.hpp"
#include "model.hpp"
#include "reducer.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace {

struct Job : ddp::test::CommJob {
  Job() : CommJob(std::chrono::seconds(10)) {}
};
using ddp::test::expect;

}  // namespace

TEST_CASE("gloo: all-reduce, broadcast, all-gather and barrier give every rank the right bytes",
          "[integration][comm]") {
  Job job;
  const int n = 3;
  job.run(n, "/t/collectives", [&](worker::Communicator& c) {
    expect(c.size() == n, "c.size() == n");
    expect(std::string(c.backend()) == "gloo", "std::string(c.backend()) == 'gloo'");
    for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
      std::vector<float> v(count);
      for (std::size_t i = 0; i < count; ++i)
        v[i] = static_cast<float>(c.rank() + 1) + static_cast<float>(i % 7);
      c.all_reduce_sum(v.data(), count);
      bool ok = true;
      for (std::size_t i = 0; i < count; ++i)
        ok = ok && v[i] == 6.0f + 3.0f * static_cast<float>(i % 7);
      expect(ok, "the all-reduced values of " + std::to_string(count) + " floats");
    }
    c.all_reduce_sum(nullptr, 0);  // nothing to do, and no hang
    std::string msg = c.rank() == 2 ? "from rank two" : std::string(13, '?');
    c.broadcast(msg.data(), msg.size(), 2);
    expect(msg == "from rank two", "msg == 'from rank two'");
    const int mine = 100 + c.rank();
    std::vector<int> all(n);
    c.all_gather(&mine, all.data(), sizeof mine);
    expect(all == std::vector<int>{100, 101, 102}, "all == std::vector<int>{100, 101, 102}");
    c.barrier();
  });
}

TEST_CASE("gloo: the bucketed reducer averages every bucket over the ranks",
          "[integration][comm]") {
  Job job;
  job.run(2, "/t/reducer", [&](worker::Communicator& c) {
    train::Model model(train::model_spec("mlp"));
    auto& g = model.grads();
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = c.rank() == 0 ? 1.0f : static_cast<float>(i % 5);
    // Small buckets: three, launched as "backward" finishes each layer.
    train::GradReducer reducer(&c, g.data(), train::plan_buckets(model, 4096, 200 * 1024));
    expect(reducer.buckets().size() == 3, "reducer.buckets().size() == 3");
    for (std::size_t layer = 3; layer-- > 0;) reducer.layer_done(layer);
    reducer.finish();
    bool ok = true;
    for (std::size_t i = 0; i < g.size(); ++i)
      ok = ok && g[i] == (1.0f + static_cast<float>(i % 5)) / 2.0f;
    expect(ok, "every gradient averaged over the two ranks");
    // A second step through the same reducer, buckets launched by finish() alone.
    std::fill(g.begin(), g.end(), static_cast<float>(c.rank()));
    reducer.finish();
    expect(g.front() == 0.5f, "g.front() == 0.5f");
    expect(g.back() == 0.5f, "g.back() == 0.5f");
  });
}

TEST_CASE("gloo: a peer that goes away is an error naming the collective, not a hang",
          "[integration][comm]") {
  Job job;
  std::string error;
  std::thread leaver([&] {
    auto comm = worker::make_gloo_communicator(job.options(1, 2, "/t/leave"));
    comm->barrier();
  });  // its communicator closes here
  auto comm = worker::make_gloo_communicator(job.options(0, 2, "/t/leave"));
  comm->barrier();
  leaver.join();
  std::vector<float> v(1 << 16, 1.0f);
  try {
    comm->all_reduce_sum(v.data(), v.size());
  } catch (const IoError& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("all_reduce") && Catch::Contains("rank 0 of 2"));
  CHECK_THROWS_WITH(comm->barrier(), Catch::Contains("failed earlier"));
}

TEST_CASE("gloo: bad options are named", "[integration][comm]") {
  worker::CommOptions o;
  o.rank = 2;
  o.size = 2;
  CHECK_THROWS_WITH(worker::make_gloo_communicator(o), Catch::Contains("rank 2"));
  o.rank = 0;
  CHECK_THROWS_WITH(worker::make_gloo_communicator(o), Catch::Contains("no store"));
#if !defined(DDP_WITH_CUDA)
  CHECK_THROWS_WITH(worker::make_nccl_communicator(o, 0), Catch::Contains("without CUDA"));
#endif
  CHECK(worker::local_address_towards("127.0.0.1") == "127.0.0.1");
  CHECK_THROWS_AS(worker::local_address_towards("no-such-host.invalid"), ConfigError);
}

TEST_CASE("a rank-0 worker without an agent hosts the job's store on MASTER_PORT",
          "[integration][comm]") {
  // A free port: bind port 0, read it, close (the usual small race is harmless here).
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  ::close(fd);
  auto env = [&](const char* rank) {
    return worker::read_worker_env(
        {{"RANK", rank}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}});
  };
  worker::WorkerStore host(env("0"));
  worker::WorkerStore guest(env("1"));
  host.client()->set("k", "v");
  CHECK(guest.client()->get("k") == "v");
}

TEST_CASE("shm: ranks on one host all-reduce through shared memory, bit-identical on every rank",
          "[integration][comm]") {
  Job job;
  const int n = 3;
  std::vector<std::vector<float>> results(n);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto o = job.options(r, n, "/t/shm2");
        auto c = worker::make_local_communicator(worker::make_gloo_communicator(o), o);
        expect(std::string(c->backend()) == "gloo+shm", "std::string(c->backend()) == 'gloo+shm'");
        // Larger than one chunk (chunks are at most 4 MB), and sizes that do not split evenly.
        for (std::size_t count : {std::size_t{1}, std::size_t{17}, std::size_t{3} << 20}) {
          std::vector<float> v(count);
          for (std::size_t i = 0; i < count; ++i)
            v[i] = 0.1f * static_cast<float>(r + 1) + static_cast<float>(i % 13);
          c->all_reduce_sum(v.data(), count);
          bool ok = true;
          for (std::size_t i = 0; i < count; ++i) {
            ok = ok && std::abs(v[i] - (0.6f + 3.0f * static_cast<float>(i % 13))) < 1e-4f;
          }
          expect(ok, "the shm all-reduced values of " + std::to_string(count) + " floats");
          if (count == (std::size_t{3} << 20)) results[static_cast<std::size_t>(r)] = v;
        }
        const int mine = r;
        std::vector<int> all(n);
        c->all_gather(&mine, all.data(), sizeof mine);  // the base's collectives still work
        expect(all == std::vector<int>{0, 1, 2}, "all == std::vector<int>{0, 1, 2}");
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  CHECK(results[0] == results[1]);
  CHECK(results[1] == results[2]);
}

TEST_CASE("shm: a rank that never arrives is an error after the timeout, not a hang",
          "[integration][comm]") {
  Job job;
  std::string error;
  std::atomic<bool> done{false};
  std::thread absent([&] {
    auto o = job.options(1, 2, "/t/shm-absent");
    auto c = worker::make_local_communicator(worker::make_gloo_communicator(o), o);
    while (!done) std::this_thread::sleep_for(5ms);  // alive, but never all-reduces
  });
  auto o = job.options(0, 2, "/t/shm-absent");
  o.timeout = 300ms;
  auto c = worker::make_local_communicator(worker::make_gloo_communicator(o), o);
  float x = 1.0f;
  try {
    c->all_reduce_sum(&x, 1);
  } catch (const IoError& e) {
    error = e.what();
  }
  done = true;
  absent.join();
  CHECK_THAT(error, Catch::Contains("rank 1 did not arrive"));
  CHECK_THROWS_WITH(c->all_reduce_sum(&x, 1), Catch::Contains("failed earlier"));
}
