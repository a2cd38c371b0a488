// Riding out a store outage, without sockets: the reconnection backoff's bounds and spread,
// the agent's account of its outages (messages, totals, the give-up line), and a store that
// came back empty: what Rendezvous::republish writes again so the round goes on.
#include "ddp/launch/outage.hpp"

#include <catch2/catch.hpp>
#include <set>

#include "ddp/launch/rendezvous.hpp"
#include "ddp/rdzv/memory_store.hpp"

using namespace ddp::launch;
using std::chrono::milliseconds;

TEST_CASE("the backoff grows to its cap and spreads over all of it", "[unit][launch][outage]") {
  Backoff b;  // 100 ms, cap 5 s
  CHECK(b.delay(0, 0.999).count() <= 100);
  CHECK(b.delay(3, 0.999).count() <= 800);
  CHECK(b.delay(3, 0.999).count() >= 790);
  CHECK(b.delay(10, 0.999).count() <= 5000);
  CHECK(b.delay(1000, 0.999).count() <= 5000);  // no overflow far out
  CHECK(b.delay(10, 0.0).count() == 0);
  // Full jitter: a thousand agents' 10th attempts land all over [0, cap], not in a burst.
  Jitter j(42);
  std::set<long> tenths;
  for (int i = 0; i < 1000; ++i) {
    const double u = j.next();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    tenths.insert(b.delay(10, u).count() / 500);
  }
  CHECK(tenths.size() == 10);  // every half second of the 5 s window is used
}

TEST_CASE("an outage begins with the first lost connection and ends with the last back",
          "[unit][launch][outage]") {
  std::vector<std::string> said;
  OutageSummary last;
  OutageMonitor m("10.0.0.1:29400", milliseconds(300000),
                  {[&](const std::string& s) { said.push_back(s); },
                   [&](const OutageSummary& s) { last = s; }});
  const auto t0 = OutageClock::now();
  m.lost("watcher", "the server closed the connection", t0);
  m.lost("rendezvous", "send failed", t0 + milliseconds(100));  // the same outage
  REQUIRE(said.size() == 1);
  CHECK(said[0] ==
        "ddprun: lost the rendezvous store at 10.0.0.1:29400 (the server closed the "
        "connection); the workers go on while it reconnects (--store-outage-grace=5 min 0 s)");
  CHECK(last.count == 1);
  CHECK(last.away_s == 0.0);
  m.back("watcher", t0 + milliseconds(2000));
  CHECK(said.size() == 1);  // the rendezvous connection is still away
  m.back("rendezvous", t0 + milliseconds(3500));
  REQUIRE(said.size() == 2);
  CHECK(said[1] ==
        "ddprun: the rendezvous store at 10.0.0.1:29400 is back after 3.5 s (outage 1); the job "
        "went on");
  CHECK(last.away_s == -1);
  CHECK(last.total_s == Approx(3.5));
  // A second outage, its connection closed before it came back: it ends unsaid, counted.
  m.lost("watcher", "reset", t0 + milliseconds(10000));
  m.forget("watcher", t0 + milliseconds(11000));
  CHECK(said.size() == 3);
  CHECK(last.count == 2);
  CHECK(last.away_s == -1);
  CHECK(last.total_s == Approx(4.5));
  CHECK(m.summary(t0 + milliseconds(20000)).total_s == Approx(4.5));
}

TEST_CASE("the give-up line says how long, the flag, and the last error",
          "[unit][launch][outage]") {
  OutageMonitor m("h:1", milliseconds(3000));
  CHECK(m.give_up_message(3.4, "connection refused") ==
        "unreachable for 3.4 s, longer than --store-outage-grace=3.0 s; connection refused");
  OutageMonitor none("h:1", milliseconds(0));
  CHECK(none.give_up_message(0, "reset") == "reset; --store-outage-grace=0: no waiting");
  CHECK(say_seconds(125) == "2 min 5 s");
}

namespace {
NodeDesc self(const std::string& host) {
  NodeDesc n;
  n.host = host;
  n.addr = host;
  n.pid = 7;
  return n;
}
}  // namespace

TEST_CASE("a store that came back empty gets this node's part of its round again",
          "[unit][launch][outage]") {
  ddp::rdzv::MemoryStore before;
  RendezvousOptions ro;
  ro.run_id = "job";
  Rendezvous rdzv(before, ro);
  const Round round = rdzv.next_round(self("a"));
  rdzv.publish_master(round, "a", 1234);
  rdzv.finished(round, "a", round.group_rank);  // one node: its finish posts "done"
  CHECK(rdzv.republish(before) == false);       // the store kept everything

  ddp::rdzv::MemoryStore empty;  // a ddprund restarted without --data-dir
  CHECK(rdzv.republish(empty) == true);
  const std::string p = "/ddprun/job/r" + std::to_string(round.number) + "/";
  CHECK(empty.get(p + "seal") == "1");
  CHECK(empty.get(p + "master") == "a:1234");
  CHECK(decode_node(empty.get(p + "node/1")).host == "a");
  CHECK(decode_event(empty.get(p + "event")).kind == RoundEvent::Kind::done);
  CHECK(empty.add("/ddprun/job/round", 0) >= round.number);
  CHECK(rdzv.republish(empty) == false);  // once is enough
}

TEST_CASE("a store that lost a round still forming makes the node join it again",
          "[unit][launch][outage]") {
  ddp::rdzv::MemoryStore store;
  RendezvousOptions ro;
  ro.run_id = "job";
  Rendezvous rdzv(store, ro);
  rdzv.claims().forming(3, 2, encode(self("b")));  // joined round 3 as the 2nd node
  ddp::rdzv::MemoryStore empty;
  CHECK_THROWS_AS(rdzv.republish(empty), StoreStateLost);
  rdzv.claims().forming(4, 0, "");  // not yet described: nothing of ours to lose
  CHECK(rdzv.republish(empty) == false);
}
