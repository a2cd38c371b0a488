// What the status HTTP endpoints answer, shared by ddprund and the agents:
//   /             the live page (page.hpp)
//   /api/status   the job as JSON (record.hpp's schema); ?run=ID, else the default run
//   /api/runs     {"runs": [...]} the runs the store has seen
//   /metrics      Prometheus text (metrics.hpp)
// The views read the store through a client of their own, used only on the HTTP thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/rdzv/server.hpp"
#include "ddp/status/http_server.hpp"
#include "ddp/status/record.hpp"

namespace ddp::rdzv {
class Store;
}

namespace ddp::status {

struct ViewSources {
  // Opens a client to the store holding the records (called again after a failure).
  std::function<std::unique_ptr<rdzv::Store>()> connect;
  std::string default_run;  // "" (ddprund): the newest run in the store's run list
  // The store this process serves, for its counters (null: none).
  std::function<rdzv::ServerStats()> store_stats;
  // An agent: its own node's record; /metrics then shows this node only (plus the store it
  // hosts), so that scraping every agent counts every rank once.
  std::function<NodeStatus()> local_node;
};

class StatusViews {
 public:
  explicit StatusViews(ViewSources sources);
  ~StatusViews();
  HttpResponse handle(const HttpRequest& request);

 private:
  ViewSources s_;
  std::unique_ptr<rdzv::Store> store_;
};

}  // namespace ddp::status
