// The agent's live status (docs/status.md): one NodeStatus kept up to date by the agent's loop
// (phases, rounds, spawns, exits, progress) and sampled and published by a thread of its own at
// a fixed interval (one SET per interval on a store connection of its own; CPU and RSS from
// /proc, GPU from NVML). It also serves the agent's HTTP views when --http-port is given,
// drives the terminal progress line, and at exit hands its trace to the store (--trace) and
// prints the summary.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/launch/progress.hpp"
#include "ddp/launch/trace.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/status/metric_history.hpp"
#include "ddp/status/record.hpp"

namespace ddp::status {
class HttpServer;
class StatusViews;
}  // namespace ddp::status

namespace ddp::launch {

enum class ProgressMode { automatic, tty, lines, off };
ProgressMode parse_progress_mode(const std::string& text);  // throws ConfigError naming --progress

struct StatusSetup {
  std::string run_id;
  std::string job_id;
  std::string host;
  int max_restarts = 0;
  double interval_s = 1;  // 0: nothing published (the views still read the local record)
  // The store that holds the records (the rendezvous store: the TCP store or the etcd
  // cluster): the publishing thread's connections, `again` after one was lost (connecting
  // briefly), and the HTTP views' own (a view never waits long). Null: none (no publishing;
  // the views show this node). tcp_status_store() fills them for a TCP store.
  std::function<std::unique_ptr<rdzv::Store>(bool again)> connect;
  std::function<std::unique_ptr<rdzv::Store>()> connect_view;
  std::string store_where;  // as the messages name it
  // HTTP views: port -1 off; 0 OS-chosen.
  std::string http_host;
  int http_port = -1;
  std::string http_token;  // non-empty: asked of every route but /healthz (http_auth.hpp)
  std::string http_tls_cert, http_tls_key;                // both set: HTTPS only
  std::function<rdzv::ServerStats()> hosted_store_stats;  // when this agent hosts the store
  std::string trace_path;                                 // --trace FILE ("": none)
  ProgressMode progress = ProgressMode::automatic;
  bool summary = true;
};

// `setup`'s connections to the TCP store at host:port with `client`'s settings.
void tcp_status_store(StatusSetup& setup, const std::string& host, std::uint16_t port,
                      const rdzv::ClientOptions& client);

struct RankStart {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = 0;
  int gpu = -1;
};

class StatusReporter {
 public:
  explicit StatusReporter(StatusSetup setup);
  ~StatusReporter();  // stops the thread and the HTTP server
  StatusReporter(const StatusReporter&) = delete;
  StatusReporter& operator=(const StatusReporter&) = delete;

  // Joins the store (takes a slot), starts the thread and the HTTP server. Never throws for
  // the store (a status view is not worth failing a job): it says so once and goes on locally.
  void start();

  // The loop's hooks (main thread).
  void phase(const std::string& name, const std::string& detail = "");
  void round_formed(int round, int group_rank, int group_world_size, int world_size,
                    int restart_count);
  void workers_started(const std::vector<RankStart>& ranks);
  void worker_exited(int local_rank, int exit_code, const std::string& error, bool failed);
  void workers_stopped();     // the agent stopped the rest (a restart, a stop)
  void hung(int local_rank);  // the hang monitor named this local rank
  void progress(const std::map<int, RankProgress>& ranks);  // by local rank
  void restarting(int round, const std::string& cause, const std::string& what);
  void failure(const std::string& cause);
  // A worker replaced in place (lifecycle's heal) has taken its first step: `what` names it.
  void healed(double seconds, const std::string& what);
  // The rendezvous store's outages (launcher/rendezvous/outage.hpp): how many, their length
  // together, the current one's so far (-1: none). Any thread.
  void store_outage(int count, double total_s, double away_s);
  // The job is over for this node: final state, the last publication, the trace, the summary.
  void finish(const std::string& state, int exit_code);

  status::NodeStatus snapshot() const;
  std::size_t history_bytes() const;  // the metric histories' memory (bounded: docs/status.md)
  int http_port() const;              // -1 when off

 private:
  struct RankTrace {
    RankSteps steps;
    std::int64_t seen_last = -1;  // the last step copied from this round's progress
  };
  static constexpr std::size_t kMaxTracePhases = 4096;
  // A local rank's metrics over the whole job (restarts included), and how far this round's
  // progress has been taken into it.
  struct RankMetrics {
    status::MetricHistory history{status::kHistoryPoints, kMaxRankMetrics + 1};  // + samples/s
    std::uint64_t seen_line = 0;
    std::int64_t seen_step = -1;
    bool told = false;  // its worker's first bad metric was printed (once a round)
  };

  void run();
  void take_metrics(status::RankStatus& r, const RankProgress& p);
  void sample_and_publish();
  void draw_progress(const status::NodeStatus& copy, double now);
  void write_trace(const status::JobStatus& job);
  status::JobStatus final_job();
  NodeTrace node_trace() const;

  StatusSetup s_;
  mutable std::mutex mu_;
  status::NodeStatus node_;
  std::vector<status::Phase> all_phases_;  // every phase for the trace (the record keeps fewer)
  std::map<int, RankTrace> steps_;         // by local rank, for the trace
  std::map<int, RankMetrics> metrics_;     // by local rank
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  std::unique_ptr<rdzv::Store> store_;          // the publishing thread's (and finish's)
  std::unique_ptr<status::StatusViews> views_;  // used on the HTTP thread only
  std::unique_ptr<status::HttpServer> http_;
  bool tty_line_ = false;  // a progress line is on the terminal (ended before the summary)
  struct Sampler;
  std::unique_ptr<Sampler> sampler_;
  double started_ = 0;
  bool finished_ = false;
  double away_since_ = 0;       // unix time the current store outage began (0: none)
  double outages_ended_s_ = 0;  // the ended outages' length together
};

}  // namespace ddp::launch
