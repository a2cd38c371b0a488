// Tests of status/job_view.hpp over an in-process store: slots, the index and the run list;
// publishing costs one store operation per interval and reading a whole job three, whatever
// its size (counted); index and run-list parsing refuse junk.
#include <catch2/catch.hpp>

#include "ddp/rdzv/memory_store.hpp"
#include "ddp/status/job_view.hpp"

using namespace ddp;
using namespace ddp::status;

namespace {
// Counts the operations that reach the store.
class CountingStore : public rdzv::MemoryStore {
 public:
  int ops = 0;
  void set(std::string_view k, std::string_view v) override { ++ops, MemoryStore::set(k, v); }
  std::string get(std::string_view k) override { return ++ops, MemoryStore::get(k); }
  std::int64_t add(std::string_view k, std::int64_t d) override {
    return ++ops, MemoryStore::add(k, d);
  }
  bool check(const std::vector<std::string>& k) override { return ++ops, MemoryStore::check(k); }
  void append(std::string_view k, std::string_view v) override { ++ops, MemoryStore::append(k, v); }
  std::vector<std::string> multi_get(const std::vector<std::string>& k) override {
    return ++ops, MemoryStore::multi_get(k);
  }
};

NodeStatus node(const std::string& run, const std::string& host) {
  NodeStatus n;
  n.run_id = run;
  n.host = host;
  n.state = "running";
  n.round = 0;
  RankStatus r;
  n.ranks.push_back(r);
  return n;
}
}  // namespace

TEST_CASE("agents take slots, publish with one SET, and a reader gets the job in three",
          "[status]") {
  CountingStore store;
  std::vector<NodeStatus> nodes;
  for (int i = 0; i < 100; ++i) {
    nodes.push_back(node("runA", "h" + std::to_string(i)));
    join(store, nodes.back());
    CHECK(nodes.back().slot == i);
  }
  store.ops = 0;
  const double now = unix_now();
  for (auto& n : nodes) publish(store, n, now);
  CHECK(store.ops == 100);  // one SET per node per interval
  store.ops = 0;
  const JobStatus job = read_job(store, "runA", now);
  CHECK(store.ops == 3);  // CHECK, GET of the index, one MULTI_GET
  REQUIRE(job.nodes.size() == 100);
  CHECK(job.nodes[42].host == "h42");
  CHECK(job.nodes[42].seq == 2);  // join's publication and this one
  CHECK(job.members == 100);
  CHECK(job.ranks == 100);

  join(store, nodes[0]);  // a second run id's first agent lists its run
  NodeStatus other = node("runB", "x");
  join(store, other);
  CHECK(list_runs(store) == std::vector<std::string>{"runA", "runB"});
  CHECK(read_job(store, "nope", now).nodes.empty());
  CHECK(read_job(store, "nope", now).state == "unknown");
}

TEST_CASE("the index and the run list skip what they cannot read", "[status]") {
  CHECK(parse_index("0,3,1,") == std::vector<int>{0, 1, 3});
  CHECK(parse_index("2,,x,-1,2,99999999999,5") == std::vector<int>{2, 5});
  CHECK(parse_index("").empty());
  CHECK(parse_runs("a\nb\na\n\nc", 10) == std::vector<std::string>{"a", "b", "c"});
  CHECK(parse_runs("a\nb\nc\n", 2) == std::vector<std::string>{"b", "c"});
}

TEST_CASE("histories have keys of their own: SET every kHistoryEvery publications, read on ask",
          "[status]") {
  CountingStore store;
  NodeStatus a = node("runH", "a"), b = node("runH", "b");
  a.history["loss"] = {{1, 10, 2.5}};
  join(store, a);  // the history with the first record
  b.state = "rendezvous";
  join(store, b);                                 // b: as an agent from before issue 36, which ...
  store.delete_key(history_key("runH", b.slot));  // ... writes no history
  const double now = unix_now();
  a.history["loss"].push_back({2, 11, 2.25});
  store.ops = 0;
  for (std::uint64_t i = 1; i <= kHistoryEvery; ++i) publish(store, a, now);
  CHECK(store.ops == static_cast<int>(kHistoryEvery) + 1);  // one record a time, one history
  JobStatus job = read_job(store, "runH", now);
  REQUIRE(job.nodes.size() == 2);
  CHECK(job.nodes[0].history.empty());  // not asked for
  store.ops = 0;
  job = read_job(store, "runH", now, true);
  CHECK(store.ops == 3 + 1 + 2 + 1);  // the job; CHECK of all, one each (b has none); MULTI_GET
  REQUIRE(job.nodes[0].history.at("loss").size() == 2);
  CHECK(job.nodes[0].history.at("loss")[1].value == 2.25);
  CHECK(job.nodes[1].history.empty());
  a.state = "succeeded";  // a final record takes its history with it
  a.history["loss"].push_back({3, 12, 2.0});
  publish(store, a, now);
  CHECK(read_job(store, "runH", now, true).nodes[0].history.at("loss").size() == 3);
}
