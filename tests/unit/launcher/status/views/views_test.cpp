// StatusViews over an in-process MemoryStore (no sockets): each route's status, content type
// and body for ddprund and for an agent, the query's run id, and reconnecting after failures.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/memory_store.hpp"
#include "ddp/status/job_view.hpp"
#include "ddp/status/page.hpp"
#include "ddp/status/views.hpp"

using namespace ddp::status;
using ddp::rdzv::MemoryStore;
using ddp::rdzv::Store;

namespace {

const std::string kJson = "application/json";
const std::string kMetrics = "text/plain; version=0.0.4; charset=utf-8";

// The store every client made by `connect` reaches; `down` makes every operation fail.
struct Backend {
  MemoryStore mem{std::chrono::milliseconds(200)};
  bool down = false;
  bool refuse = false;  // connect() itself fails
  int connects = 0;
};

class Client : public Store {
 public:
  explicit Client(Backend& b) : b_(b) {}
  void set(std::string_view k, std::string_view v) override { up().set(k, v); }
  std::string get(std::string_view k) override { return up().get(k); }
  std::int64_t add(std::string_view k, std::int64_t d) override { return up().add(k, d); }
  std::string compare_set(std::string_view k, std::string_view e, std::string_view d) override {
    return up().compare_set(k, e, d);
  }
  bool check(const std::vector<std::string>& k) override { return up().check(k); }
  void wait(const std::vector<std::string>& k) override { up().wait(k); }
  void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override {
    up().wait(k, t);
  }
  bool delete_key(std::string_view k) override { return up().delete_key(k); }
  std::int64_t num_keys() override { return up().num_keys(); }
  void append(std::string_view k, std::string_view v) override { up().append(k, v); }
  std::vector<std::string> multi_get(const std::vector<std::string>& k) override {
    return up().multi_get(k);
  }
  void multi_set(const std::vector<std::string>& k, const std::vector<std::string>& v) override {
    up().multi_set(k, v);
  }
  std::vector<std::string> list_keys() override { return up().list_keys(); }

 private:
  MemoryStore& up() {
    if (b_.down) DDP_THROW(ddp::IoError, "the store went away");
    return b_.mem;
  }
  Backend& b_;
};

ViewSources sources(Backend& b) {
  ViewSources s;
  s.connect = [&b]() -> std::unique_ptr<Store> {
    ++b.connects;
    if (b.refuse) DDP_THROW(ddp::IoError, "cannot connect to the store");
    return std::make_unique<Client>(b);
  };
  return s;
}

NodeStatus node(const std::string& run, const std::string& host, int nranks) {
  NodeStatus n;
  n.run_id = run;
  n.host = host;
  n.state = "running";
  n.round = 0;
  n.interval_s = 1;
  for (int i = 0; i < nranks; ++i) {
    RankStatus r;
    r.local_rank = i;
    r.rank = i;
    r.state = "running";
    n.ranks.push_back(r);
  }
  return n;
}

HttpResponse get(StatusViews& v, const std::string& path, const std::string& query = "") {
  return v.handle({"GET", path, query});
}

}  // namespace

TEST_CASE("query_param finds, decodes and bounds one parameter", "[status][views]") {
  CHECK_FALSE(query_param("", "run").value);
  CHECK_FALSE(query_param("xrun=1&runx=2", "run").value);
  CHECK(query_param("run=abc", "run").value == std::string("abc"));
  CHECK(query_param("a=1&run=x%2Fy+z&run=second", "run").value == std::string("x/y z"));
  CHECK(query_param("run", "run").value == std::string(""));
  CHECK(query_param("run=%e2%9C%93", "run").value == std::string("\xe2\x9c\x93"));
  for (const char* bad : {"run=%zz", "run=%4", "run=%", "run=a%0Ab", "run=%7f"}) {
    INFO(bad);
    const auto q = query_param(bad, "run");
    CHECK_FALSE(q.value);
    CHECK(q.error.find("'run'") != std::string::npos);
  }
  CHECK(query_param("run=" + std::string(256, 'a'), "run").value->size() == 256);
  CHECK(query_param("run=" + std::string(257, 'a'), "run").error.find("256") != std::string::npos);
  // Counted decoded: 256 escapes decode to 256 bytes.
  std::string escaped;
  for (int i = 0; i < 256; ++i) escaped += "%41";
  CHECK(query_param("run=" + escaped, "run").value == std::string(256, 'A'));
}

TEST_CASE("ddprund's views route every path over the store's runs", "[status][views]") {
  Backend b;
  NodeStatus a = node("r1", "a", 2), c = node("r2", "c", 1), d = node("r2", "d", 3);
  join(b.mem, a);
  join(b.mem, c);
  join(b.mem, d);
  int stats_calls = 0;
  ViewSources s = sources(b);
  s.store_stats = [&] {
    ++stats_calls;
    return ddp::rdzv::ServerStats{};
  };
  StatusViews v(std::move(s));

  auto page = get(v, "/");
  CHECK(page.status == 200);
  CHECK(page.content_type == "text/html; charset=utf-8");
  CHECK(page.body == std::string(status_page_html()));

  auto newest = get(v, "/api/status");
  REQUIRE(newest.status == 200);
  CHECK(newest.content_type == kJson);
  JobStatus job = job_from_json(newest.body);
  CHECK(job.run_id == "r2");
  REQUIRE(job.nodes.size() == 2);
  CHECK(job.nodes[0].host == "c");
  CHECK(job.nodes[1].host == "d");
  CHECK(job.ranks == 4);

  auto r1 = get(v, "/api/status", "run=r1");
  REQUIRE(r1.status == 200);
  CHECK(job_from_json(r1.body).run_id == "r1");
  CHECK(job_from_json(r1.body).nodes.size() == 1);

  auto unknown = get(v, "/api/status", "run=nope");
  CHECK(unknown.status == 404);
  CHECK(unknown.content_type == kJson);
  CHECK(nlohmann::json::parse(unknown.body).at("error").get<std::string>().find("nope") !=
        std::string::npos);

  auto bad = get(v, "/api/status", "run=%zz");
  CHECK(bad.status == 400);
  CHECK(nlohmann::json::parse(bad.body).contains("error"));
  CHECK(get(v, "/api/status", "run=" + std::string(300, 'x')).status == 400);

  auto runs = get(v, "/api/runs");
  CHECK(runs.status == 200);
  CHECK(runs.content_type == kJson);
  CHECK(nlohmann::json::parse(runs.body) == nlohmann::json{{"runs", {"r1", "r2"}}});

  auto metrics = get(v, "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.content_type == kMetrics);
  CHECK(stats_calls == 1);

  auto missing = get(v, "/nope");
  CHECK(missing.status == 404);
  CHECK(get(v, "/api/status/extra").status == 404);
  CHECK(b.connects == 1);  // one client for all of it
}

TEST_CASE("ddprund's views of an empty store", "[status][views]") {
  Backend b;
  StatusViews v(sources(b));
  auto status = get(v, "/api/status");
  CHECK(status.status == 404);
  CHECK(status.content_type == kJson);
  CHECK(nlohmann::json::parse(get(v, "/api/runs").body) ==
        nlohmann::json{{"runs", nlohmann::json::array()}});
  CHECK(get(v, "/metrics").status == 200);
}

TEST_CASE("the views drop a failed client and reconnect on the next request", "[status][views]") {
  Backend b;
  NodeStatus a = node("r1", "a", 1);
  join(b.mem, a);
  StatusViews v(sources(b));

  b.refuse = true;
  auto refused = get(v, "/api/runs");
  CHECK(refused.status == 503);
  CHECK(refused.content_type == kJson);
  CHECK(get(v, "/api/status").status == 503);
  CHECK(get(v, "/metrics").status == 200);  // without the jobs, still an answer
  b.refuse = false;
  CHECK(get(v, "/api/runs").status == 200);
  const int after_first = b.connects;

  // A client that breaks: dropped, one new attempt within the same request, then 503.
  b.down = true;
  CHECK(get(v, "/api/status").status == 503);
  CHECK(b.connects == after_first + 1);
  b.down = false;
  CHECK(get(v, "/api/status").status == 200);
  CHECK(b.connects == after_first + 2);
  CHECK(get(v, "/api/status").status == 200);
  CHECK(b.connects == after_first + 2);  // kept while it works
}

TEST_CASE("an agent's views show its own node when the store does not", "[status][views]") {
  Backend b;
  NodeStatus other = node("r9", "other", 2);
  join(b.mem, other);
  NodeStatus mine = node("r9", "mine", 3);
  mine.updated_unix = 1;  // long ago: still shown alive, since it is the one answering
  int stats_calls = 0;
  ViewSources s = sources(b);
  s.default_run = "r9";
  s.local_node = [&] { return mine; };
  s.store_stats = [&] {
    ++stats_calls;
    return ddp::rdzv::ServerStats{};
  };
  StatusViews v(std::move(s));

  // The store reachable: the whole job from it.
  auto whole = get(v, "/api/status");
  REQUIRE(whole.status == 200);
  CHECK(job_from_json(whole.body).nodes.size() == 1);
  CHECK(job_from_json(whole.body).nodes[0].host == "other");

  b.down = true;
  auto alone = get(v, "/api/status");
  REQUIRE(alone.status == 200);
  CHECK(alone.content_type == kJson);
  JobStatus job = job_from_json(alone.body);
  CHECK(job.run_id == "r9");
  REQUIRE(job.nodes.size() == 1);
  CHECK(job.nodes[0].host == "mine");
  CHECK_FALSE(job.nodes[0].lost);
  CHECK(job.ranks == 3);
  CHECK(nlohmann::json::parse(get(v, "/api/runs").body) == nlohmann::json{{"runs", {"r9"}}});
  CHECK(get(v, "/api/status", "run=elsewhere").status == 503);

  const int connects = b.connects;
  auto metrics = get(v, "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.content_type == kMetrics);
  CHECK(stats_calls == 1);
  CHECK(b.connects == connects);  // an agent's metrics never read the store
}

TEST_CASE("an agent whose run has no record yet shows its own node", "[status][views]") {
  Backend b;
  ViewSources s = sources(b);
  s.local_node = [] { return node("fresh", "mine", 1); };
  StatusViews v(std::move(s));
  auto r = get(v, "/api/status");
  REQUIRE(r.status == 200);
  CHECK(job_from_json(r.body).nodes.at(0).host == "mine");
  CHECK(get(v, "/api/status", "run=other").status == 404);
}
