// The sharded collectives (reduce_scatter_sum, all_gather_v) of the gloo and shm communicators on
// 1 to 8 ranks as threads, even and uneven parts (empty ones, one larger than the others, parts
// past a message segment and a shared-memory step), out of place and in place, checked bitwise
// against a plain reference; the rank-order sum they document; counts that are named errors.
#include <catch2/catch.hpp>

#include "support/ranks.hpp"
#include "support/comm_job.hpp"
#include "support/store_fixture.hpp"
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/worker/comm.hpp"

using namespace ddp;
using namespace std::chrono_literals;
using Counts = std::vector<std::size_t>;

namespace {

using ddp::test::expect;

std::string describe(const Counts& counts) {
  std::string s = "counts {";
  for (std::size_t q = 0; q < counts.size(); ++q) {
    s += (q ? "," : "") + std::to_string(counts[q]);
  }
  return s + "}";
}

using Job = ddp::test::CommJob;

// Small integers, so every sum of up to 8 of them is exact whatever the order.
float value(int rank, std::size_t i) {
  return static_cast<float>((static_cast<std::size_t>(rank) * 7 + i * 3) % 17) - 8.0f;
}
float gathered(int rank, std::size_t j) {
  return static_cast<float>((static_cast<std::size_t>(rank) * 5 + j) % 23) - 11.5f;
}

std::vector<Counts> count_cases(int n) {
  const auto w = static_cast<std::size_t>(n);
  std::vector<Counts> cases;
  for (std::size_t total : {std::size_t{0}, std::size_t{1}, 3 * w + 1, std::size_t{1000}}) {
    cases.push_back(worker::even_shards(total, n));
  }
  // Empty parts, and one part larger than the others: past a gloo segment (2^18 floats) and
  // several shared-memory steps.
  Counts mixed(w);
  for (std::size_t q = 0; q < w; ++q) mixed[q] = q % 3 == 1 ? 0 : 5 * (q + 1);
  mixed[w / 2] = 300001;
  cases.push_back(mixed);
  cases.push_back(worker::even_shards(70000 * w + 3, n));  // every rank sums several steps
  return cases;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

void check_sharded(worker::Communicator& c, const Counts& counts) {
  const int n = c.size();
  const auto r = static_cast<std::size_t>(c.rank());
  const auto off = worker::shard_offsets("test", counts, n);
  const std::size_t total = off.back();
  const std::size_t mine = counts[r];
  const std::string what = describe(counts) + " on rank " + std::to_string(r);

  std::vector<float> in(total);
  for (std::size_t i = 0; i < total; ++i) in[i] = value(c.rank(), i);
  std::vector<float> ref(mine, 0.0f);
  for (int s = 0; s < n; ++s) {
    for (std::size_t j = 0; j < mine; ++j) ref[j] += value(s, off[r] + j);
  }
  std::vector<float> out(mine + 1, 99.0f);  // one more: a canary
  c.reduce_scatter_sum(in.data(), out.data(), counts);
  expect(same_bits(out.data(), ref.data(), mine), "the reduce-scattered part, " + what);
  expect(out[mine] == 99.0f, "nothing written past the part, " + what);
  std::vector<float> inplace = in;
  c.reduce_scatter_sum(inplace.data(), inplace.data() + off[r], counts);
  expect(same_bits(inplace.data() + off[r], ref.data(), mine),
         "the reduce-scattered part in place, " + what);

  std::vector<float> part(mine);
  for (std::size_t j = 0; j < mine; ++j) part[j] = gathered(c.rank(), j);
  std::vector<float> whole(total);
  for (int q = 0; q < n; ++q) {
    const auto uq = static_cast<std::size_t>(q);
    for (std::size_t j = 0; j < counts[uq]; ++j) whole[off[uq] + j] = gathered(q, j);
  }
  std::vector<float> all(total + 1, 99.0f);
  c.all_gather_v(part.data(), all.data(), counts);
  expect(same_bits(all.data(), whole.data(), total), "the gathered whole, " + what);
  expect(all[total] == 99.0f, "nothing written past the whole, " + what);
  std::vector<float> all2(total, -1.0f);
  std::copy(part.begin(), part.end(), all2.begin() + static_cast<std::ptrdiff_t>(off[r]));
  c.all_gather_v(all2.data() + off[r], all2.data(), counts);
  expect(same_bits(all2.data(), whole.data(), total), "the gathered whole in place, " + what);
}

void check_every_case(const std::string& backend) {
  Job job;
  for (int n : {1, 2, 3, 4, 5, 8}) {
    INFO(backend << " on " << n << " ranks");
    job.run(backend, n, "/t/" + backend + "/" + std::to_string(n), [&](worker::Communicator& c) {
      for (const auto& counts : count_cases(n)) check_sharded(c, counts);
      // The segment is shared with the all-reduce: it still works after the sharded calls.
      std::vector<float> v(1000, static_cast<float>(c.rank() + 1));
      c.all_reduce_sum(v.data(), v.size());
      expect(v.back() == static_cast<float>(n * (n + 1) / 2), "an all-reduce after them");
    });
  }
}

}  // namespace

TEST_CASE("even_shards cuts a total as evenly as can be, the first ranks one larger",
          "[integration][comm][collectives]") {
  CHECK(worker::even_shards(10, 4) == Counts{3, 3, 2, 2});
  CHECK(worker::even_shards(8, 4) == Counts{2, 2, 2, 2});
  CHECK(worker::even_shards(2, 5) == Counts{1, 1, 0, 0, 0});
  CHECK(worker::even_shards(0, 1) == Counts{0});
  CHECK(worker::shard_offsets("x", Counts{3, 0, 2}, 3) == Counts{0, 3, 3, 5});
  CHECK_THROWS_AS(worker::even_shards(10, 0), ConfigError);
}

TEST_CASE("gloo: reduce_scatter_sum and all_gather_v match the reference on 1 to 8 ranks",
          "[integration][comm][collectives]") {
  check_every_case("gloo");
}

TEST_CASE("shm: reduce_scatter_sum and all_gather_v match the reference on 1 to 8 ranks",
          "[integration][comm][collectives]") {
  check_every_case("shm");
}

TEST_CASE("gloo and shm sum in rank order: shm's reduce-scatter then all-gather is its all-reduce",
          "[integration][comm][collectives]") {
  // Values whose sums round, so the order of the additions shows in the bits.
  auto noisy = [](int rank, std::size_t i) {
    return 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i % 101);
  };
  const Counts counts{5000, 0, 70001};
  const auto off = worker::shard_offsets("test", counts, 3);
  for (const std::string backend : {"gloo", "shm"}) {
    INFO(backend);
    Job job;
    job.run(backend, 3, "/t/order", [&](worker::Communicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      std::vector<float> in(off.back());
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = noisy(c.rank(), i);
      std::vector<float> ref(counts[r]);
      for (std::size_t j = 0; j < ref.size(); ++j) {
        ref[j] = (noisy(0, off[r] + j) + noisy(1, off[r] + j)) + noisy(2, off[r] + j);
      }
      std::vector<float> part(counts[r]);
      c.reduce_scatter_sum(in.data(), part.data(), counts);
      expect(same_bits(part.data(), ref.data(), ref.size()), "sums in rank order");
      std::vector<float> whole(off.back());
      c.all_gather_v(part.data(), whole.data(), counts);
      if (std::string(c.backend()) == "gloo+shm") {
        c.all_reduce_sum(in.data(), in.size());
        expect(same_bits(whole.data(), in.data(), in.size()), "the all-reduce's bits");
      }
    });
  }
}

TEST_CASE("counts without one entry per rank are a ConfigError naming the collective",
          "[integration][comm][collectives]") {
  for (const std::string backend : {"gloo", "shm"}) {
    INFO(backend);
    Job job;
    std::vector<std::string> errors(2);
    job.run(backend, 2, "/t/bad", [&](worker::Communicator& c) {
      std::vector<float> in(4, 1.0f);
      std::vector<float> out(4);
      auto& error = errors[static_cast<std::size_t>(c.rank())];
      try {
        c.reduce_scatter_sum(in.data(), out.data(), Counts{1, 1, 2});
      } catch (const ConfigError& e) {
        error = e.what();
      }
      try {
        c.all_gather_v(in.data(), out.data(), Counts{4});
      } catch (const ConfigError& e) {
        error += std::string(" | ") + e.what();
      }
      // Nothing was sent: the communicator still works.
      c.reduce_scatter_sum(in.data(), out.data(), Counts{2, 2});
      expect(out[0] == 2.0f && out[1] == 2.0f, "a reduce-scatter after the errors");
    });
    for (const auto& e : errors) {
      CHECK_THAT(e, Catch::Contains("reduce_scatter_sum: counts has 3 entries for a world of 2"));
      CHECK_THAT(e, Catch::Contains("all_gather_v: counts has 1 entries for a world of 2"));
    }
  }
}
