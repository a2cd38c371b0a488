// One contract, two stores: every Store operation checked the same way against StoreClient on
// a real server and against MemoryStore, with N ranks as threads, so tests written against
// MemoryStore mean the same thing as against the wire.
#include <catch2/catch.hpp>
#include <algorithm>
#include <memory>

#include "support/ranks.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/memory_store.hpp"
#include "ddp/rdzv/server.hpp"

using namespace ddp::rdzv;
using namespace std::chrono_literals;

namespace {

// Hands each rank its own Store on one shared state: a client of one server, or the one
// MemoryStore (thread-safe) itself.
struct Backend {
  std::unique_ptr<StoreServer> server;
  std::shared_ptr<MemoryStore> memory;
  explicit Backend(bool tcp) {
    if (tcp) {
      ServerOptions o;
      o.threads = 2;
      server = std::make_unique<StoreServer>(o);
      server->start();
    } else {
      memory = std::make_shared<MemoryStore>(5s);
    }
  }
  std::shared_ptr<Store> store() {
    if (memory) return memory;
    ClientOptions o;
    o.timeout = 5s;
    o.connect_timeout = 5s;
    return std::make_shared<StoreClient>("127.0.0.1", server->port(), o);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("the Store contract holds for the TCP client and the in-memory store",
                   "[integration][store]", std::true_type, std::false_type) {
  Backend b(TestType::value);
  auto s = b.store();
  s->set("a", "1");
  CHECK(s->get("a") == "1");
  CHECK(s->add("n", 5) == 5);
  CHECK(s->add("n", -2) == 3);
  CHECK(s->compare_set("c", "", "x") == "x");      // missing, expected empty: set
  CHECK(s->compare_set("c", "nope", "y") == "x");  // mismatch: the stored value
  CHECK(s->compare_set("c", "x", "y") == "y");     // match: swapped
  CHECK(s->compare_set("m", "e", "d") == "e");     // missing, expected non-empty: no set
  CHECK(s->check({"a", "n"}));
  CHECK_FALSE(s->check({"a", "m"}));
  s->multi_set({"k1", "k2"}, {"v1", "v2"});
  CHECK(s->multi_get({"k2", "k1"}) == std::vector<std::string>{"v2", "v1"});
  CHECK(s->num_keys() == 5);
  CHECK(s->delete_key("k1"));
  CHECK_FALSE(s->delete_key("k1"));
  auto keys = s->list_keys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"a", "c", "k2", "n"});
  CHECK_THROWS_AS(s->wait({"never"}, 50ms), ddp::TimeoutError);
}

TEMPLATE_TEST_CASE("N ranks as threads: an add barrier and a gather through any Store",
                   "[integration][store]", std::true_type, std::false_type) {
  Backend b(TestType::value);
  constexpr int kRanks = 6;
  std::vector<std::string> seen(kRanks);
  ddp::test::run_ranks(kRanks, [&](int rank) {
    auto s = b.store();
    s->set("rank/" + std::to_string(rank), std::to_string(rank * rank));
    if (s->add("arrived", 1) == kRanks) s->set("all", "1");
    s->wait({"all"});
    std::vector<std::string> keys;
    for (int r = 0; r < kRanks; ++r) keys.push_back("rank/" + std::to_string(r));
    auto values = s->multi_get(keys);
    std::string joined;
    for (const auto& v : values) joined += v + ",";
    seen[static_cast<std::size_t>(rank)] = joined;
  });
  for (const auto& v : seen) CHECK(v == "0,1,4,9,16,25,");
}

TEST_CASE("run_ranks names the rank that failed", "[integration][store]") {
  try {
    ddp::test::run_ranks(3, [](int rank) {
      if (rank == 2) throw ddp::IoError("boom");
    });
    FAIL("expected the rank's error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "rank 2: boom");
  }
}
