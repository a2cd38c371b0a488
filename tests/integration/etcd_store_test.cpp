// EtcdStore (etcd/store.hpp) against a real etcd (tests/support/etcd_fixture.hpp): the Store
// contract, counters that stay exact under concurrent adds in one request each, waits woken by
// watches and timing out by name, the round's composites (create_with in one txn, wait_get's value
// from the watch), the c10d rounds (launch::Rendezvous) formed on etcd with etcd
// requests per agent that do not grow with the agent count, an unreachable cluster named in the
// error within the timeout, and a 3-member cluster that loses its leader mid-job.
#include <catch2/catch.hpp>
#include <algorithm>
#include <memory>
#include <set>
#include <thread>

#include "support/etcd_fixture.hpp"
#include "support/skip.hpp"
#include "support/ranks.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/etcd/store.hpp"

using namespace std::chrono_literals;
using ddp::rdzv::etcd::EtcdStore;
using ddp::test::EtcdCluster;

#define NEEDS_ETCD()                                       \
  if (!ddp::test::etcd_available()) {                      \
    DDP_SKIP_TOOL("/usr/bin/etcd (Debian's etcd-server)"); \
  }

namespace {

std::unique_ptr<EtcdStore> store(const EtcdCluster& c, const std::string& prefix = "/t/") {
  return std::make_unique<EtcdStore>(c.options(), prefix, 5s);
}

ddp::launch::NodeDesc desc(int i) {
  ddp::launch::NodeDesc n;
  n.host = "h" + std::to_string(i);
  n.addr = n.host;
  n.pid = 1000 + i;
  n.nproc = 2;
  return n;
}

}  // namespace

TEST_CASE("etcd store: the Store contract on a real etcd", "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd;
  auto s = store(etcd);
  s->set("a", "1");
  CHECK(s->get("a") == "1");
  CHECK(s->add("n", 5) == 5);
  CHECK(s->add("n", -2) == 3);
  CHECK(s->add("n", 0) == 3);
  CHECK(s->compare_set("c", "", "x") == "x");      // missing, expected empty: set
  CHECK(s->compare_set("c", "nope", "y") == "x");  // mismatch: the stored value
  CHECK(s->compare_set("c", "x", "y") == "y");     // match: swapped
  CHECK(s->compare_set("m", "e", "d") == "e");     // missing, expected non-empty: no set
  CHECK_FALSE(s->check({"m"}));
  CHECK(s->check({"a", "c"}));
  s->multi_set({"k1", "k2", "k1"}, {"v1", "v2", "v3"});  // a key twice: the last wins
  CHECK(s->multi_get({"k2", "k1"}) == std::vector<std::string>{"v2", "v3"});
  s->append("ap", "x");
  s->append("ap", "y");
  CHECK(s->get("ap") == "xy");
  std::string binary("\0\xff\n", 3);
  s->set("bin", binary);
  CHECK(s->get("bin") == binary);
  auto keys = s->list_keys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"a", "ap", "bin", "c", "k1", "k2"});
  CHECK(s->num_keys() == 6);
  CHECK(s->delete_key("a"));
  CHECK(s->delete_key("n"));  // a counter's entries go too
  CHECK(s->add("n", 0) == 0);
  CHECK_FALSE(s->delete_key("never"));
  // Another prefix is another store.
  auto other = store(etcd, "/u/");
  CHECK(other->list_keys().empty());
  CHECK_FALSE(other->check({"c"}));
}

TEST_CASE("etcd store: more keys than etcd takes in one txn", "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd;
  auto s = store(etcd);
  // etcd refuses a txn of more than 128 operations (--max-txn-ops): 300 keys go in chunks,
  // read back as one snapshot.
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("many/" + std::to_string(i));
    values.push_back("v" + std::to_string(i));
  }
  s->multi_set(keys, values);
  CHECK(s->multi_get(keys) == values);
  CHECK(s->check(keys));
  s->wait(keys, 5s);
}

TEST_CASE("etcd store: concurrent adds are exact with one request each", "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd;
  constexpr int kThreads = 8, kAdds = 10;
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::vector<std::uint64_t> requests(kThreads);
  ddp::test::run_ranks(kThreads, [&](int i) {
    auto s = store(etcd);
    for (int k = 0; k < kAdds; ++k) seen[static_cast<std::size_t>(i)].push_back(s->add("count", 1));
    requests[static_cast<std::size_t>(i)] = s->http().requests();
  });
  std::set<std::int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  CHECK(all.size() == kThreads * kAdds);  // every add saw a different total: 1..80
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAdds);
  // One txn per add (the entry and the range that reads it back), no retries under contention.
  for (auto r : requests) CHECK(r == kAdds);
}

TEST_CASE("etcd store: create_with is one txn that only its creator writes, and wait_get's value",
          "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd;
  auto s = store(etcd);
  auto other = store(etcd);
  const auto before = s->http().requests();
  CHECK(s->create_with("seal", "2", {"a/1", "a/2"}, {"x", "y"}) == "2");
  CHECK(s->http().requests() - before == 1);  // the seal and both assignments: one txn
  CHECK(s->multi_get({"a/1", "a/2"}) == std::vector<std::string>{"x", "y"});
  // A second creator loses: it gets the first one's value and writes nothing.
  CHECK(other->create_with("seal", "3", {"a/1", "a/3"}, {"LOST", "LOST"}) == "2");
  CHECK(s->get("a/1") == "x");
  CHECK_FALSE(s->check({"a/3"}));
  // wait_get: a key there already, and one put while it waits (the value from the watch).
  CHECK(s->wait_get("seal", 5s) == "2");
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    other->set("late", "v-late");
  });
  CHECK(s->wait_get("late", 10s) == "v-late");
  t.join();
  CHECK_THROWS_WITH(s->wait_get("never", 200ms), Catch::Contains("never"));
}

TEST_CASE("etcd store: wait is woken by a put and times out naming the keys",
          "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd;
  auto waiter = store(etcd), writer = store(etcd);
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->set("late1", "x");
    writer->set("late2", "y");
  });
  waiter->wait({"late1", "late2"}, 10s);
  CHECK(waiter->get("late2") == "y");
  t.join();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(waiter->wait({"late1", "never"}, 300ms),
                    Catch::Contains("never") && !Catch::Contains("late1"));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // a bound, not a timing claim
}

TEST_CASE("etcd store: the c10d rounds form on etcd with constant etcd requests per agent",
          "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd;
  // Each agent's etcd requests for one round, watches counted: a constant bound, whatever the
  // agent count (issue 37; it was 10, watches not counted). Every agent: the round (1 range),
  // its arrival (1 txn), its description (1 put). The others: the seal (a watch and a range)
  // and the assignment written with it (1 range): 6. The sealer, the MAX-th to arrive: the
  // descriptions (a range to see them there, a range to read them; a watch and a range more if
  // one is late), the seal with every assignment (1 txn): 6 (measured: 6 to 7 with the
  // connection's first request).
  for (int n : {2, 4, 8}) {
    const std::string id = "job" + std::to_string(n);
    std::vector<ddp::launch::Round> rounds(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> requests(static_cast<std::size_t>(n));
    ddp::test::run_ranks(n, [&](int i) {
      auto s = store(etcd);
      ddp::launch::Rendezvous r(*s, {id, n, n, false, 20s});
      rounds[static_cast<std::size_t>(i)] = r.next_round(desc(i));
      requests[static_cast<std::size_t>(i)] = s->http().requests();
    });
    std::set<int> ranks;
    for (const auto& r : rounds) {
      CHECK(r.group_world_size == n);
      ranks.insert(r.group_rank);
    }
    CHECK(ranks.size() == static_cast<std::size_t>(n));
    const auto most = *std::max_element(requests.begin(), requests.end());
    const auto least = *std::min_element(requests.begin(), requests.end());
    INFO("agents " << n << ": " << least << " to " << most << " etcd requests per agent");
    CHECK(most <= 9);  // 7, and a late description's watch and range
    CHECK(least <= 6);
  }
}

TEST_CASE("etcd store: an unreachable cluster is named within the timeout", "[integration][etcd]") {
  ddp::rdzv::etcd::EtcdOptions o;
  o.endpoints = {{"127.0.0.1", ddp::test::free_loopback_port()},
                 {"127.0.0.1", ddp::test::free_loopback_port()}};
  o.timeout = 600ms;
  o.connect_timeout = 100ms;
  // "Within the timeout", with room for a loaded machine: the request gives up at its deadline
  // (o.timeout after it starts) plus at most one connect attempt and one back-off, both far
  // under this margin. A call that ignored the configured timeout (kept the 15 s default, or
  // retried without a deadline) would not end before it.
  const auto bound = o.timeout + 5s;
  EtcdStore s(o, "/x/", 1s);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(
      s.set("k", "v"),
      Catch::Contains("no member of 127.0.0.1:" + std::to_string(o.endpoints[0].port) +
                      ",127.0.0.1:" + std::to_string(o.endpoints[1].port)) &&
          Catch::Contains("within 600 ms"));
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  INFO("set() on an unreachable cluster took " << elapsed.count() << " ms, bound " << bound.count()
                                               << " ms");
  CHECK(elapsed < bound);
}

TEST_CASE("etcd store: a 3-member cluster loses its leader and the store goes on",
          "[integration][etcd]") {
  NEEDS_ETCD();
  EtcdCluster etcd(3);
  auto s = std::make_unique<EtcdStore>(etcd.options(20s), "/l/", 20s);
  s->set("before", "1");
  CHECK(s->add("n", 1) == 1);
  const int leader = etcd.leader();
  REQUIRE(leader >= 0);
  etcd.kill(leader);
  s->set("after", "2");  // through a follower, or after it was elected
  CHECK(s->get("before") == "1");
  CHECK(s->get("after") == "2");
  CHECK(s->add("n", 1) == 2);
  CHECK(s->compare_set("ev", "", "lost") == "lost");
}
