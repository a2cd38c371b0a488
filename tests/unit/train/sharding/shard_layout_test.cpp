// Sharding's pure pieces (issue 19): the shard layout (every slot cut evenly, a rank's parts in
// the flat order, the parts of all ranks tiling the model), init_slice (any slice drawn alone
// equals Model::init's), and the collective thread's order and error rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "comm_thread.hpp"
#include "ddp/proto/error.hpp"
#include "model.hpp"
#include "shard_layout.hpp"

using namespace ddp::train;

TEST_CASE("shard layout: the ranks' parts tile every slot, evenly, in the flat order",
          "[unit][train][sharding]") {
  const ModelSpec spec = model_spec(ModelKind::mlp, 7, 3);  // 784-7-7-7-10: odd sizes
  const auto slots = layout_slots(spec);
  for (int world : {1, 2, 3, 5, 8}) {
    std::vector<int> owner(param_count(spec), -1);
    std::size_t sum = 0;
    for (int r = 0; r < world; ++r) {
      const ShardLayout s = make_shard_layout(slots, world, r);
      CHECK(s.total == param_count(spec));
      std::size_t local = 0;
      for (std::size_t k = slots.size(); k-- > 0;) {  // the last layer first
        CHECK(s.local[k] == local);
        local += s.part(k);
        const std::size_t even = slots[k].size() / static_cast<std::size_t>(world);
        CHECK((s.part(k) == even || s.part(k) == even + 1));
        for (std::size_t i = s.lo[k]; i < s.hi[k]; ++i) {
          CHECK(owner[slots[k].w + i] == -1);
          owner[slots[k].w + i] = r;
        }
      }
      CHECK(s.shard_size == local);
      sum += s.shard_size;
    }
    CHECK(sum == param_count(spec));
    CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
  }
  CHECK_THROWS_AS(make_shard_layout(slots, 0, 0), ddp::ConfigError);
  CHECK_THROWS_WITH(make_shard_layout(slots, 2, 2), Catch::Contains("rank 2 of a world of 2"));
}

TEST_CASE("init_slice: a shard drawn alone equals the whole model's initialisation",
          "[unit][train][sharding]") {
  for (const ModelSpec& spec : {model_spec(ModelKind::mlp, 9, 2), model_spec("convnet")}) {
    Model whole(spec);
    whole.init(42);
    const ShardLayout s = make_shard_layout(whole.slots(), 3, 1);
    std::vector<float> shard(s.shard_size);
    for (std::size_t k = 0; k < s.slots.size(); ++k) {
      init_slice(spec, 42, k, s.lo[k], s.hi[k], shard.data() + s.local[k]);
    }
    for (std::size_t k = 0; k < s.slots.size(); ++k) {
      for (std::size_t i = s.lo[k]; i < s.hi[k]; ++i) {
        REQUIRE(shard[s.local[k] + i - s.lo[k]] == whole.params()[s.slots[k].w + i]);
      }
    }
    std::vector<float> other(s.slots[0].size());
    init_slice(spec, 43, 0, 0, other.size(), other.data());
    CHECK(other[0] != whole.params()[s.slots[0].w]);  // another seed, other values
  }
}

TEST_CASE(
    "collective thread: tasks run in order, wait covers earlier tickets, an error "
    "skips the rest and is rethrown",
    "[unit][train][sharding]") {
  CommThread t;
  std::vector<int> order;
  std::uint64_t last = 0;
  for (int i = 0; i < 50; ++i) last = t.post([&order, i] { order.push_back(i); });
  t.wait(last);
  REQUIRE(order.size() == 50);
  for (int i = 0; i < 50; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
  t.wait(0);
  std::atomic<int> after{0};
  const auto bad = t.post([] { throw ddp::IoError("all_gather_v: peer gone"); });
  const auto skipped = t.post([&] { after = 1; });
  CHECK_THROWS_WITH(t.wait(bad), Catch::Contains("peer gone"));
  CHECK_THROWS_AS(t.wait(skipped), ddp::IoError);
  CHECK(after.load() == 0);
}
