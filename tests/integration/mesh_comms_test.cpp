// make_mesh_comms over a real store server on 127.0.0.1:0, four ranks as threads (issue 20):
// with dp=2,tp=2 each rank's tp group reduces over its row only and its dp group over its
// column only (Gloo, and with shared memory in front, all ranks being on this host); dp=4,tp=1
// leaves no tp communicator; CountingCommunicator counts the bytes of each kind of collective.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <array>
#include <numeric>
#include <string>
#include <vector>

#include "support/comm_job.hpp"
#include "support/ranks.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "mesh.hpp"

using namespace ddp;
using ddp::test::expect;

namespace {

struct Job : ddp::test::CommJob {
  Job() : CommJob(std::chrono::seconds(10)) {}
  // Rank r's mesh: a Gloo world under prefix + "/world", the groups under prefix + "/mesh".
  train::MeshComms mesh(int r, int n, const std::string& prefix, train::MeshShape shape, bool shm,
                        std::unique_ptr<worker::Communicator>* world) {
    *world = worker::make_gloo_communicator(options(r, n, prefix + "/world"));
    return train::make_mesh_comms(world->get(), options(r, n, prefix + "/mesh"), shape,
                                  train::MeshBackend::gloo, shm, 0);
  }
};

std::string this_host() {
  std::array<char, 256> name{};
  ::gethostname(name.data(), name.size() - 1);
  return name.data();
}

float member_sum(const std::vector<int>& ranks, float scale, float plus) {
  float s = 0.0f;
  for (int q : ranks) s += scale * static_cast<float>(q + 1) + plus;
  return s;
}

}  // namespace

TEST_CASE("mesh dp=2,tp=2: the tp group reduces over its row, the dp group over its column",
          "[integration][mesh_comms]") {
  const bool shm = GENERATE(false, true);
  INFO("shm " << shm);
  Job job;
  const int n = 4;
  const std::string prefix = shm ? "/t/mesh-shm" : "/t/mesh";
  test::run_ranks(n, [&](int r) {
    std::unique_ptr<worker::Communicator> world;
    train::MeshComms m = job.mesh(r, n, prefix, {2, 2}, shm, &world);
    const std::string want_backend = shm ? "gloo+shm" : "gloo";
    expect(m.hosts == std::vector<std::string>(4, this_host()), "every rank on this host");
    expect(!m.place.tp_crosses_nodes, "no tp group crosses nodes");
    expect(m.tp_rank == r % 2 && m.dp_rank == r / 2, "rank r at (r / 2, r % 2)");
    expect(m.tp && m.dp, "both groups have a communicator");
    expect(m.tp->size() == 2 && m.tp->rank() == m.tp_rank, "the tp communicator's rank");
    expect(m.dp->size() == 2 && m.dp->rank() == m.dp_rank, "the dp communicator's rank");
    expect(m.tp->backend() == want_backend, "tp backend " + want_backend);
    expect(m.dp->backend() == want_backend, "dp backend " + want_backend);
    const auto& row = m.place.tp_groups[static_cast<std::size_t>(r / 2)];
    const auto& col = m.place.dp_groups[static_cast<std::size_t>(r % 2)];
    expect(row == std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}, "this rank's row");
    expect(col == std::vector<int>{r % 2, r % 2 + 2}, "this rank's column");

    // all_reduce_sum: over the row only, then over the column only.
    std::vector<float> v(1000);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(r + 1) + static_cast<float>(i % 3);
    std::vector<float> w = v;
    m.tp->all_reduce_sum(v.data(), v.size());
    m.dp->all_reduce_sum(w.data(), w.size());
    bool ok = true;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto plus = static_cast<float>(i % 3);
      ok = ok && v[i] == member_sum(row, 1.0f, plus) && w[i] == member_sum(col, 1.0f, plus);
    }
    expect(ok, "the row's and the column's sums (tp: 4 row + 3, dp: 2 col + 4)");

    // reduce_scatter_sum on the dp group: parts of 3 and 2 floats.
    const std::vector<std::size_t> counts = {3, 2};
    std::vector<float> whole(5);
    for (std::size_t i = 0; i < whole.size(); ++i)
      whole[i] = 100.0f * static_cast<float>(r + 1) + static_cast<float>(i);
    std::vector<float> part(counts[static_cast<std::size_t>(m.dp_rank)]);
    m.dp->reduce_scatter_sum(whole.data(), part.data(), counts);
    const std::size_t off = m.dp_rank == 0 ? 0 : 3;
    for (std::size_t k = 0; k < part.size(); ++k) {
      expect(part[k] == member_sum(col, 100.0f, static_cast<float>(off + k)),
             "the dp reduce-scatter's part " + std::to_string(k));
    }

    // all_gather_v on the tp group: 1 float from tp rank 0, 2 from tp rank 1.
    const std::vector<std::size_t> tp_counts = {1, 2};
    std::vector<float> mine(tp_counts[static_cast<std::size_t>(m.tp_rank)],
                            static_cast<float>(r) + 0.5f);
    std::vector<float> gathered(3, -1.0f);
    m.tp->all_gather_v(mine.data(), gathered.data(), tp_counts);
    const auto r0 = static_cast<float>(row[0]) + 0.5f;
    const auto r1 = static_cast<float>(row[1]) + 0.5f;
    expect(gathered == std::vector<float>{r0, r1, r1}, "the tp all_gather_v's whole");
  });
}

TEST_CASE("mesh dp=4,tp=1: no tp communicator, the dp group is the world",
          "[integration][mesh_comms]") {
  Job job;
  const int n = 4;
  test::run_ranks(n, [&](int r) {
    std::unique_ptr<worker::Communicator> world;
    train::MeshComms m = job.mesh(r, n, "/t/mesh-dp4", {4, 1}, true, &world);
    expect(m.tp == nullptr, "a tp group of one has no communicator");
    expect(m.dp != nullptr && m.dp->size() == 4 && m.dp->rank() == r, "the dp group of four");
    expect(m.tp_rank == 0 && m.dp_rank == r, "rank r at (r, 0)");
    float x = static_cast<float>(r + 1);
    m.dp->all_reduce_sum(&x, 1);
    expect(x == 10.0f, "the sum over all four ranks");
  });
}

TEST_CASE("mesh: one rank without a world, and a shape that does not fit the world",
          "[integration][mesh_comms]") {
  Job job;
  train::MeshComms one = train::make_mesh_comms(nullptr, job.options(0, 1, "/t/mesh-one"), {1, 1},
                                                train::MeshBackend::gloo, true, 0);
  CHECK(one.tp == nullptr);
  CHECK(one.dp == nullptr);
  CHECK(one.hosts == std::vector<std::string>{this_host()});
  CHECK_THROWS_AS(train::make_mesh_comms(nullptr, job.options(0, 1, "/t/mesh-bad"), {2, 1},
                                         train::MeshBackend::gloo, true, 0),
                  ConfigError);
  // Every rank refuses the shape before the first collective: an error, not a hang.
  std::vector<std::string> errors(2);
  test::run_ranks(2, [&](int r) {
    auto world = worker::make_gloo_communicator(job.options(r, 2, "/t/mesh-misfit/world"));
    // Both ranks finish connecting before either refuses the shape and closes its pairs:
    // without it a fast rank 1 closes while rank 0 is still handshaking.
    world->barrier();
    try {
      train::make_mesh_comms(world.get(), job.options(r, 2, "/t/mesh-misfit/mesh"), {2, 2},
                             train::MeshBackend::gloo, false, 0);
    } catch (const ConfigError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("--mesh dp=2,tp=2"));
}

TEST_CASE("CountingCommunicator counts the bytes each kind of collective hands it",
          "[integration][mesh_comms]") {
  Job job;
  const int n = 4;
  std::vector<train::CountingCommunicator::Counts> seen(n);
  test::run_ranks(n, [&](int r) {
    std::unique_ptr<worker::Communicator> world;
    train::MeshComms m = job.mesh(r, n, "/t/mesh-count", {2, 2}, false, &world);
    train::CountingCommunicator tp(std::move(m.tp));
    expect(tp.size() == 2 && tp.rank() == r % 2, "it forwards rank() and size()");
    expect(std::string(tp.backend()) == "gloo", "it forwards backend()");
    std::vector<float> v(10, 1.0f);
    tp.all_reduce_sum(v.data(), v.size());  // 40 bytes
    expect(v[0] == 2.0f, "the all-reduce went through");
    const std::vector<std::size_t> counts = {3, 2};
    std::vector<float> whole(5, 1.0f);
    std::vector<float> part(counts[static_cast<std::size_t>(tp.rank())]);
    tp.reduce_scatter_sum(whole.data(), part.data(), counts);  // 20 bytes
    tp.all_gather_v(part.data(), whole.data(), counts);        // 20 bytes
    expect(whole == std::vector<float>(5, 2.0f), "reduce-scatter then all-gather");
    const int id = r;
    std::array<int, 2> ids{};
    tp.all_gather(&id, ids.data(), sizeof id);  // 2 x 4 bytes
    char msg[6] = "hello";
    tp.broadcast(msg, sizeof msg, 0);  // 6 bytes
    tp.barrier();                      // no bytes, one call
    seen[static_cast<std::size_t>(r)] = tp.counts();
    tp.reset();
    expect(tp.counts().total() == 0 && tp.counts().calls == 0, "reset() clears the counts");
  });
  for (const auto& c : seen) {
    CHECK(c.all_reduce_bytes == 40);
    CHECK(c.reduce_scatter_bytes == 20);
    CHECK(c.all_gather_bytes == 28);
    CHECK(c.other_bytes == 6);
    CHECK(c.calls == 6);
    CHECK(c.total() == 94);
  }
  CHECK_THROWS_AS(train::CountingCommunicator(nullptr), ConfigError);
}
