// Point-to-point exchange() on the gloo and shm communicators (rings, some ranks idle, sizes
// that differ per rank, bad peers named), and the shard copies of in-place recovery over it:
// a replaced rank gets back its shard and head from its successor's copy, survivors their own,
// and both holders of a shard replaced is a named error on every rank.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "shard_copies.hpp"
#include "support/comm_job.hpp"
#include "support/ranks.hpp"

using namespace ddp;

namespace {

using ddp::test::expect;
using Job = ddp::test::CommJob;

// Rank q's shard: q + 1 thousand floats (a different size on each rank), values naming q.
std::vector<float> shard_of(int q) {
  std::vector<float> v(static_cast<std::size_t>(q + 1) * 1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(q * 100000 + i);
  return v;
}
std::size_t floats_of(int q) { return static_cast<std::size_t>(q + 1) * 1000; }

}  // namespace

TEST_CASE("exchange: a ring, idle ranks, sizes per rank, on gloo and shm",
          "[integration][comm][shard_copies]") {
  for (const std::string backend : {"gloo", "shm"}) {
    INFO(backend);
    Job job;
    for (int n : {1, 2, 3, 4}) {
      job.run(backend, n, "/t/x/" + backend + std::to_string(n), [&](worker::Communicator& c) {
        const int r = c.rank();
        const int next = (r + 1) % n;
        const int prev = (r + n - 1) % n;
        const auto mine = shard_of(r);
        std::vector<float> got(floats_of(prev), -1.0f);
        c.exchange(mine.data(), mine.size() * sizeof(float), next, got.data(),
                   got.size() * sizeof(float), prev);
        expect(got == shard_of(prev), "the predecessor's shard");
        // Only rank 0 sends (to the last rank), the others idle.
        float one = 7.0f + static_cast<float>(r);
        float in = -1.0f;
        const bool sends = r == 0 && n > 1;
        const bool receives = r == n - 1 && n > 1;
        c.exchange(&one, sends ? sizeof one : 0, sends ? n - 1 : -1, &in, receives ? sizeof in : 0,
                   receives ? 0 : -1);
        expect(in == (receives ? 7.0f : -1.0f), "rank 0's float, on the last rank only");
        // Still in step with the other collectives.
        float x = 1.0f;
        c.all_reduce_sum(&x, 1);
        expect(x == static_cast<float>(n), "an all-reduce after the exchanges");
      });
    }
  }
  Job job;
  job.run("gloo", 2, "/t/x/bad", [&](worker::Communicator& c) {
    float f = 0.0f;
    try {
      c.exchange(&f, sizeof f, 2, &f, sizeof f, -1);
      expect(false, "a peer outside the world was taken");
    } catch (const ConfigError& e) {
      expect(std::string(e.what()) == "exchange: rank 2 is not in a world of 2", e.what());
    }
  });
}

TEST_CASE("shard copies: a replaced rank gets its shard from its successor, at the copy's head",
          "[integration][shard_copies]") {
  Job job;
  const int n = 4;
  job.run("gloo", n, "/t/copies", [&](worker::Communicator& c) {
    const int r = c.rank();
    const int prev = (r + n - 1) % n;
    train::ShardCopies copies;
    expect(!copies.holds(), "nothing before the first keep()");
    copies.keep(c, {1, 5, 37, 38}, shard_of(r), floats_of(prev));
    expect(copies.holds(), "a copy after keep()");
    expect(copies.bytes() == (floats_of(r) + floats_of(prev)) * sizeof(float),
           "its own shard and its predecessor's");
    // Rank 2 is a new process: it holds nothing; the others keep what they hold.
    train::ShardCopies fresh;
    const bool replaced = r == 2;
    auto got = (replaced ? fresh : copies).heal(c, replaced, floats_of(r));
    expect(got.state == shard_of(r), "every rank's own shard back");
    expect(got.head == train::ShardCopies::Head{1, 5, 37, 38}, "the copy's head");
    expect(got.from == (replaced ? 3 : r), "the replacement's shard from its successor");
  });
}

TEST_CASE("shard copies: a rank and its successor replaced together is an error on every rank",
          "[integration][shard_copies]") {
  Job job;
  const int n = 4;
  std::vector<std::string> errors(n);
  job.run("gloo", n, "/t/copies2", [&](worker::Communicator& c) {
    const int r = c.rank();
    train::ShardCopies copies;
    copies.keep(c, {0, 3, 3, 3}, shard_of(r), floats_of((r + n - 1) % n));
    train::ShardCopies fresh;
    const bool replaced = r == 1 || r == 2;
    try {
      (replaced ? fresh : copies).heal(c, replaced, floats_of(r));
    } catch (const ProtocolError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK(e ==
          "in-place recovery of a sharded job: rank 1's shard has no copy: its holder, "
          "rank 2, was replaced too; the job restarts from its last snapshot");
  }
}
