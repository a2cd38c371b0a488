// The health bus over a real store: O(1) operations per node per check. N node buses (one
// StoreClient each) run K checks and a stacks round against a StoreServer on 127.0.0.1:0; the
// server's request count, read after a round trip on the node's own connection, gives each
// node's exact cost per call. The leader collects what every node published, nothing waits for
// a node that has not published, and the in-memory bus of a one-node job behaves the same.
#include "support/store_fixture.hpp"
#include "ddp/launch/health.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;
using namespace std::chrono_literals;

namespace {

struct Store : ddp::test::ServerFixture {
  Store()
      : ServerFixture([] {
          ddp::rdzv::ServerOptions o;
          o.threads = 2;
          return o;
        }()) {}
};

NodeSummary summary(int g, std::uint64_t seq) {
  NodeSummary s;
  s.group_rank = g;
  s.host = "node" + std::to_string(g);
  s.seq = seq;
  for (int l = 0; l < 2; ++l) {
    RankHealth r;
    r.rank = 2 * g + l;
    r.local_rank = l;
    r.pid = 1000 + r.rank;
    r.step = static_cast<std::int64_t>(seq) * 10 + l;
    r.phase = l ? "forward" : "";
    r.reports = l == 0;
    r.idle_s = 0.25 * static_cast<double>(seq) + g;
    r.cpu_frac = 0.5 + 0.01 * g;
    r.state = l ? 'R' : 'S';
    r.median_step_s = 0.1 * (g + 1);
    r.steps_known = static_cast<int>(seq);
    s.ranks.push_back(r);
  }
  return s;
}

// The job's buses: node g talks through clients[g]; counts the requests each call costs.
struct Job {
  Store store;
  std::vector<std::unique_ptr<ddp::rdzv::StoreClient>> clients;
  std::vector<std::unique_ptr<HealthBus>> buses;
  std::uint64_t mark = 0;

  explicit Job(int n) {
    for (int g = 0; g < n; ++g) clients.push_back(store.client());
    for (int g = n - 1; g >= 0; --g) {  // the leader last: the others' keys do not exist yet
      buses.push_back(
          store_health_bus(*clients[static_cast<std::size_t>(g)], "/ddprun/r1/round/3", g, n));
    }
    std::reverse(buses.begin(), buses.end());
    sync(0);
  }
  HealthBus& bus(int g) { return *buses[static_cast<std::size_t>(g)]; }
  // The requests since the last call, node g's last among them: one PING on g's connection
  // makes sure the server has counted everything g sent (SET has no reply), and is not counted.
  std::uint64_t sync(int g) {
    clients[static_cast<std::size_t>(g)]->ping(7);
    auto now = store.server.stats().requests;
    auto d = now - mark - 1;
    mark = now;
    return d;
  }
};

}  // namespace

TEST_CASE("health bus: O(1) store requests per node per check", "[integration][launch]") {
  constexpr int kChecks = 10;
  for (int n : {2, 8, 32}) {
    INFO("nodes: " << n);
    Job job(n);
    CHECK(job.bus(0).leader());
    CHECK_FALSE(job.bus(n - 1).leader());
    // Making the buses asked nothing of the store (one that is away then costs no agent).
    CHECK(job.sync(0) == 0);
    // Nobody published yet: the leader gets nothing, at once (it makes the keys, empty).
    CHECK(job.bus(0).collect().empty());
    CHECK(job.sync(0) == 3);  // MULTI_SET, then WAIT + MULTI_GET
    CHECK_THROWS_AS(job.bus(1).collect(), ddp::ConfigError);
    CHECK(job.sync(1) == 0);

    std::vector<std::uint64_t> worst(2, 0);  // non-leaders, leader
    for (int k = 1; k <= kChecks; ++k) {
      for (int g = 1; g < n; ++g) {  // each non-leader: publish, read the trigger
        job.bus(g).publish(summary(g, static_cast<std::uint64_t>(k)));
        CHECK(job.bus(g).triggered() == 0);
        worst[0] = std::max(worst[0], job.sync(g));
      }
      job.bus(0).publish(summary(0, static_cast<std::uint64_t>(k)));
      auto got = job.bus(0).collect();
      CHECK(job.bus(0).triggered() == 0);
      worst[1] = std::max(worst[1], job.sync(0));
      REQUIRE(got.size() == static_cast<std::size_t>(n));
      for (int g = 0; g < n; ++g) {
        const auto& s = got[static_cast<std::size_t>(g)];
        CHECK(s.group_rank == g);
        CHECK(s.seq == static_cast<std::uint64_t>(k));
        CHECK(encode_summary(s) == encode_summary(summary(g, static_cast<std::uint64_t>(k))));
      }
    }
    // Non-leader: SET + COMPARE_SET. Leader: SET + WAIT + MULTI_GET (the collect); its trigger
    // is its own and answered from memory.
    CHECK(worst[0] == 2);
    CHECK(worst[1] == 3);

    // A hang: the leader asks for stacks (one MULTI_SET); every node sees the epoch.
    job.bus(0).trigger(1);
    CHECK(job.sync(0) == 1);
    CHECK(job.bus(0).triggered() == 1);
    CHECK(job.sync(0) == 0);
    for (int g = 1; g < n; ++g) {
      CHECK(job.bus(g).triggered() == 1);
      CHECK(job.sync(g) == 1);
    }
    // Half the nodes answer: the leader takes what arrived and does not wait for the rest.
    for (int g = 0; g < n; g += 2) {
      job.bus(g).publish_stacks(1, "[{\"rank\":" + std::to_string(2 * g) + "}]");
      CHECK(job.sync(g) == 1);
    }
    auto part = job.bus(0).collect_stacks(1);
    CHECK(job.sync(0) == 2);
    REQUIRE(part.size() == static_cast<std::size_t>((n + 1) / 2));
    for (std::size_t i = 0; i < part.size(); ++i) {
      CHECK(part[i].first == static_cast<int>(2 * i));
      CHECK(part[i].second == "[{\"rank\":" + std::to_string(4 * i) + "}]");
    }
    for (int g = 1; g < n; g += 2) job.bus(g).publish_stacks(1, "[]");
    for (int g = 1; g < n; g += 2) job.sync(g);
    CHECK(job.bus(0).collect_stacks(1).size() == static_cast<std::size_t>(n));
    job.sync(0);
    // An epoch never asked for has no keys: nothing, without a request.
    CHECK(job.bus(0).collect_stacks(2).empty());
    CHECK(job.sync(0) == 0);
    // Epochs only go up.
    CHECK_THROWS_AS(job.bus(0).trigger(1), ddp::ConfigError);
    job.bus(0).trigger(5);
    job.sync(0);  // the trigger's SET has no reply: the PING makes sure the store applied it
    CHECK(job.bus(n - 1).triggered() == 5);
  }
}

TEST_CASE("health bus: a non-leader before the leader reads no trigger", "[integration][launch]") {
  Store s;
  auto c = s.client();
  auto node = store_health_bus(*c, "/ddprun/r2/round/0", 1, 2);
  CHECK(node->triggered() == 0);  // the key does not exist: read without waiting
  node->publish(summary(1, 1));
  CHECK(node->triggered() == 0);  // a round trip: the SET is applied before the leader starts
  auto lc = s.client();
  auto leader = store_health_bus(*lc, "/ddprun/r2/round/0", 0, 2);
  // The leader's first use emptied node 1's key: absent until its next check.
  CHECK(leader->collect().empty());
  node->publish(summary(1, 2));
  CHECK(node->triggered() == 0);  // a round trip: the SET before it has been applied
  auto got = leader->collect();
  REQUIRE(got.size() == 1);
  CHECK(got[0].seq == 2);
  CHECK_THROWS_AS(store_health_bus(*c, "/p", 2, 2), ddp::ConfigError);
}

TEST_CASE("health bus: a bad summary in the store is named", "[integration][launch]") {
  Store s;
  auto c = s.client();
  auto leader = store_health_bus(*c, "/p", 0, 2);
  CHECK(leader->collect().empty());  // its first use makes the keys
  c->set("/p/health/1", "{\"g\":1}");
  CHECK_THROWS_WITH(leader->collect(),
                    Catch::Contains("node 1") && Catch::Contains("'h' is missing"));
  c->set("/p/health/1", encode_summary(summary(0, 1)));
  CHECK_THROWS_WITH(leader->collect(), Catch::Contains("group rank 0"));
}

TEST_CASE("local health bus: one node, in memory", "[integration][launch]") {
  auto bus = local_health_bus();
  CHECK(bus->leader());
  CHECK(bus->collect().empty());
  bus->publish(summary(0, 1));
  bus->publish(summary(0, 2));
  auto got = bus->collect();
  REQUIRE(got.size() == 1);
  CHECK(encode_summary(got[0]) == encode_summary(summary(0, 2)));
  CHECK(bus->triggered() == 0);
  bus->trigger(3);
  CHECK(bus->triggered() == 3);
  CHECK(bus->collect_stacks(3).empty());
  bus->publish_stacks(3, "[]");
  auto stacks = bus->collect_stacks(3);
  REQUIRE(stacks.size() == 1);
  CHECK(stacks[0] == std::pair<int, std::string>{0, "[]"});
  CHECK(bus->collect_stacks(2).empty());
  CHECK_THROWS_AS(bus->trigger(3), ddp::ConfigError);
}
