// KvTable semantics without sockets: torch's CAS and ADD rules, waiter wake-ups, queues,
// barriers, and leases driven by an explicit clock.
#include "ddp/rdzv/kv_table.hpp"

#include <catch2/catch.hpp>

#include "ddp/proto/error.hpp"

using namespace ddp::rdzv;
using std::string_view;

TEST_CASE("compare_set follows torch's three cases", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  CHECK(t.compare_set("k", "x", "y", w) == "x");  // missing, expected non-empty: no set
  CHECK(t.get("k") == nullptr);
  CHECK(t.compare_set("k", "", "y", w) == "y");  // missing, expected empty: set
  CHECK(*t.get("k") == "y");
  CHECK(t.compare_set("k", "nope", "z", w) == "y");  // present, mismatch: current value
  CHECK(t.compare_set("k", "y", "z", w) == "z");     // present, match: swapped
  CHECK(*t.get("k") == "z");
}

TEST_CASE("add keeps ASCII decimal and refuses non-numbers and overflow", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  CHECK(t.add("c", 5, w) == 5);
  CHECK(t.add("c", -7, w) == -2);
  CHECK(*t.get("c") == "-2");
  t.set("s", "abc", w);
  CHECK_THROWS_AS(t.add("s", 1, w), ddp::ProtocolError);
  t.set("big", "9223372036854775807", w);
  CHECK_THROWS_AS(t.add("big", 1, w), ddp::ProtocolError);
  CHECK(*t.get("big") == "9223372036854775807");
}

TEST_CASE("waits complete only when every key exists", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  std::vector<string_view> keys{"a", "b"};
  CHECK_FALSE(t.wait(1, keys));
  t.set("a", "1", w);
  CHECK(w.empty());
  t.append("b", "2", w);
  CHECK(w == Woken{1});
  CHECK_FALSE(t.is_waiting(1));
  CHECK(t.wait(2, keys));  // both present now
}

TEST_CASE("delete does not wake, cancel drops the registration", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  std::vector<string_view> keys{"k"};
  CHECK_FALSE(t.wait(1, keys));
  CHECK_FALSE(t.erase("k"));
  CHECK(w.empty());
  t.cancel(1);
  t.set("k", "v", w);
  CHECK(w.empty());
}

TEST_CASE("several waiters on one key all wake", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  std::vector<string_view> keys{"k"};
  for (WaiterId id = 1; id <= 3; ++id) CHECK_FALSE(t.wait(id, keys));
  t.compare_set("k", "", "v", w);
  CHECK(w == Woken{1, 2, 3});
}

TEST_CASE("queues: push wakes one waiter, pop is FIFO, check sees a non-empty queue",
          "[unit][rdzv]") {
  KvTable t;
  Woken w;
  std::vector<string_view> keys{"q"};
  CHECK_FALSE(t.wait(1, keys));
  CHECK_FALSE(t.wait(2, keys));
  t.queue_push("q", "a", w);
  CHECK(w == Woken{1});
  t.queue_push("q", "b", w);
  CHECK(w == Woken{1, 2});
  CHECK(t.exists("q"));
  CHECK(t.num_keys() == 0);  // queues are not keys
  std::string v;
  CHECK(t.queue_pop("q", v) == 2);
  CHECK(v == "a");
  CHECK(t.queue_pop("q", v) == 1);
  CHECK(v == "b");
  CHECK(t.queue_pop("q", v) == 0);
  CHECK_FALSE(t.exists("q"));
}

TEST_CASE("barrier counts arrivals and releases at world size", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  CHECK_FALSE(t.barrier(1, "b", 3, w));
  CHECK_FALSE(t.barrier(2, "b", 3, w));
  CHECK(w.empty());
  CHECK(t.barrier(3, "b", 3, w));
  CHECK(w == Woken{1, 2});
  CHECK(*t.get("b") == "3");
}

TEST_CASE("a cancelled barrier arrival still counts but is not woken", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  CHECK_FALSE(t.barrier(1, "b", 2, w));
  t.cancel(1);
  CHECK(t.barrier(2, "b", 2, w));
  CHECK(w.empty());
}

TEST_CASE("leases expire on the injected clock and take their keys along", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  auto l = t.lease_grant(Millis(100), 0, Millis(1000));
  REQUIRE(t.set_with_lease("node/1", "alive", l, w));
  t.set("plain", "x", w);
  CHECK(t.next_expiry() == Millis(1100));
  CHECK(t.expire(Millis(1099), w) == 0);
  CHECK(t.lease_keepalive(l, Millis(1050)));  // pushes expiry to 1150
  CHECK(t.expire(Millis(1100), w) == 0);
  CHECK(t.get("node/1") != nullptr);
  CHECK(t.expire(Millis(1150), w) == 1);
  CHECK(t.get("node/1") == nullptr);
  CHECK(t.get("plain") != nullptr);
  CHECK_FALSE(t.lease_keepalive(l, Millis(1200)));
  CHECK_FALSE(t.set_with_lease("x", "y", l, w));
}

TEST_CASE("a plain set detaches a key from its lease", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  auto l = t.lease_grant(Millis(10), 0, Millis(0));
  REQUIRE(t.set_with_lease("k", "1", l, w));
  t.set("k", "2", w);
  CHECK(t.expire(Millis(10), w) == 1);
  CHECK(*t.get("k") == "2");
}

TEST_CASE("releasing a connection revokes its bound leases and waits", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  auto bound = t.lease_grant(Millis(0), 42, Millis(0));
  auto other = t.lease_grant(Millis(0), 43, Millis(0));
  REQUIRE(t.set_with_lease("mine", "1", bound, w));
  REQUIRE(t.set_with_lease("theirs", "1", other, w));
  std::vector<string_view> keys{"never"};
  CHECK_FALSE(t.wait(42, keys));
  CHECK_FALSE(t.next_expiry().has_value());  // no ttl: bound leases never expire by time
  t.release_owner(42, w);
  CHECK(t.get("mine") == nullptr);
  CHECK(t.get("theirs") != nullptr);
  CHECK_FALSE(t.is_waiting(42));
  CHECK(t.num_leases() == 1);
}

TEST_CASE("the byte cap refuses a write whole and frees what deletes give back", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  const auto entry = [](std::size_t k, std::size_t v) { return k + v + KvTable::kEntryOverhead; };
  t.set_max_bytes(2 * entry(1, 100));
  t.set("a", std::string(100, 'x'), w);
  t.append("b", std::string(100, 'y'), w);
  CHECK(t.bytes() == 2 * entry(1, 100));
  CHECK_THROWS_WITH(t.set("c", "1", w), Catch::Contains("the store is full"));
  CHECK(t.get("c") == nullptr);
  CHECK_THROWS_AS(t.append("a", "more", w), ddp::ProtocolError);
  CHECK(t.get("a")->size() == 100);
  CHECK_THROWS_AS(t.queue_push("q", "v", w), ddp::ProtocolError);
  t.set("a", "short", w);  // shrinking is always allowed
  CHECK(t.bytes() == entry(1, 5) + entry(1, 100));
  CHECK(t.erase("b"));
  t.queue_push("q", std::string(50, 'q'), w);
  std::string out;
  CHECK(t.queue_pop("q", out) == 1);
  auto lease = t.lease_grant(Millis(10), 0, Millis(0));
  REQUIRE(t.set_with_lease("l", "v", lease, w));
  t.expire(Millis(10), w);
  CHECK(t.erase("a"));
  CHECK(t.bytes() == 0);
}

TEST_CASE("a huge ttl saturates instead of overflowing the clock", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  auto l = t.lease_grant(Millis::max(), 0, Millis(7));  // found by the fuzzer (UBSan overflow)
  REQUIRE(t.set_with_lease("k", "v", l, w));
  CHECK(t.lease_keepalive(l, Millis(1000)));
  CHECK(t.expire(Millis::max() - Millis(1), w) == 0);
  CHECK(t.get("k") != nullptr);
}

TEST_CASE("a lease's will fires on expiry and on connection loss, not on revoke", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  std::string_view keys[] = {"event"};
  REQUIRE_FALSE(t.wait(7, keys));  // a watcher waits for the event key
  auto expiring = t.lease_grant(Millis(100), 0, Millis(0));
  REQUIRE(t.lease_will(expiring, "event", "lost:a"));
  auto bound = t.lease_grant(Millis(0), 42, Millis(0));
  REQUIRE(t.lease_will(bound, "event", "lost:b"));
  auto revoked = t.lease_grant(Millis(100), 0, Millis(0));
  REQUIRE(t.lease_will(revoked, "other", "x"));
  CHECK_FALSE(t.lease_will(999, "k", "v"));

  REQUIRE(t.lease_revoke(revoked));
  CHECK(t.get("other") == nullptr);  // a deliberate revoke is a clean exit: no will

  CHECK(t.expire(Millis(100), w) == 1);
  REQUIRE(t.get("event") != nullptr);
  CHECK(*t.get("event") == "lost:a");
  CHECK(w == Woken{7});

  w.clear();
  t.release_owner(42, w);  // the first will holds: a will never overwrites
  CHECK(*t.get("event") == "lost:a");
  CHECK(w.empty());
}

TEST_CASE("an empty will key clears the will", "[unit][rdzv]") {
  KvTable t;
  Woken w;
  auto l = t.lease_grant(Millis(0), 5, Millis(0));
  REQUIRE(t.lease_will(l, "k", "v"));
  REQUIRE(t.lease_will(l, "", "ignored"));
  t.release_owner(5, w);
  CHECK(t.num_keys() == 0);
}
