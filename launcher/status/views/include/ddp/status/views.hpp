// What the status HTTP endpoints answer, shared by ddprund and the agents:
//   /             the live page (page.hpp)
//   /api/status   the job as JSON (record.hpp's schema); ?run=ID, else the default run
//   /api/history  the metric curves (history_export.hpp): ?format=json|csv|jsonl, ?scope=
//   /api/runs     {"runs": [...]} the runs the store has seen
//   /page_*.js    the page's scripts
//   /metrics      Prometheus text (metrics.hpp)
// The views read the store through a client of their own, used only on the HTTP thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/rdzv/server.hpp"
#include "ddp/status/http_server.hpp"
#include "ddp/status/record.hpp"

namespace ddp::rdzv {
class Store;
}

namespace ddp::status {

struct ViewSources {
  // Opens a client to the store holding the records (called again after a failure). Called on
  // the HTTP thread while a request waits: give the client short timeouts (a few seconds).
  std::function<std::unique_ptr<rdzv::Store>()> connect;
  std::string default_run;  // "" (ddprund): the newest run in the store's run list
  // The store this process serves, for its counters (null: none).
  std::function<rdzv::ServerStats()> store_stats;
  // An agent: its own node's record; /metrics then shows this node only (plus the store it
  // hosts), so that scraping every agent counts every rank once. Called on the HTTP thread.
  std::function<NodeStatus()> local_node;
};

inline constexpr std::size_t kMaxRunIdBytes = 256;

// One parameter of a query string ("a=1&run=x%2Fy"), percent-decoded ('+' is a space).
struct QueryParam {
  std::optional<std::string> value;  // nullopt when absent (the first occurrence counts)
  std::string error;  // not empty: a bad escape, a control byte, or over max_bytes decoded
};
QueryParam query_param(std::string_view query, std::string_view name,
                       std::size_t max_bytes = kMaxRunIdBytes);

// Not thread-safe: one HttpServer thread calls handle().
class StatusViews {
 public:
  explicit StatusViews(ViewSources sources);
  ~StatusViews();
  StatusViews(const StatusViews&) = delete;
  StatusViews& operator=(const StatusViews&) = delete;
  HttpResponse handle(const HttpRequest& request);

 private:
  // The run the query names (or the default) into `job`; an error answer when there is none.
  std::optional<HttpResponse> read_run(const HttpRequest& request, JobStatus& job, bool history);
  HttpResponse api_status(const HttpRequest& request);
  HttpResponse api_history(const HttpRequest& request);
  HttpResponse api_runs();
  HttpResponse metrics();
  // Runs f on the store, connecting first when there is no client. On a ddp::Error the client
  // is dropped and, if it was not new, f runs once more on a new one. False: unreachable.
  bool with_store(const std::function<void(rdzv::Store&)>& f);
  JobStatus local_job();  // the agent's own node alone

  ViewSources s_;
  std::unique_ptr<rdzv::Store> store_;
  bool store_failing_ = false;  // the last attempt failed (logged once per outage)
};

}  // namespace ddp::status
