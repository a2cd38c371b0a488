// The agent's status record, its publishing thread and its views (status_reporter.hpp). The
// loop's hooks only change the record under the mutex; the thread samples /proc and NVML, sets
// the record in the store (one SET per interval) and draws the progress line. The store is a
// view's concern, never the job's: a store that fails is said once and the record stays local.
#include "ddp/launch/status_reporter.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ddp/launch/gpu_sample.hpp"
#include "ddp/launch/proc_sample.hpp"
#include "ddp/launch/status_text.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/status/http_server.hpp"
#include "ddp/status/job_view.hpp"
#include "ddp/status/views.hpp"

namespace ddp::launch {

namespace {
constexpr double kLinesEvery = 10;  // seconds between plain progress lines (--progress lines)

// The lower of the middle two values of an even count (a step time that was measured).
double lower_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

void trim_events(std::vector<status::Phase>& v) {
  if (v.size() > status::kMaxEvents) v.erase(v.begin(), v.end() - status::kMaxEvents);
}
}  // namespace

ProgressMode parse_progress_mode(const std::string& text) {
  if (text == "auto") return ProgressMode::automatic;
  if (text == "tty") return ProgressMode::tty;
  if (text == "lines") return ProgressMode::lines;
  if (text == "off") return ProgressMode::off;
  DDP_THROW(ConfigError, "--progress: invalid choice '" + text +
                             "' (choose from auto, tty, "
                             "lines, off)");
}

// What the thread samples: CPU ticks per pid between two looks, NVML.
struct StatusReporter::Sampler {
  GpuSampler gpus;
  std::map<int, std::pair<std::uint64_t, double>> cpu;  // pid -> (ticks, when)
  double last_line = -1;
  bool joined = false;      // took a slot in the store once: reconnect after a loss
  double reconnect_at = 0;  // not before (unix seconds)
  int reconnects = 0;
};

void tcp_status_store(StatusSetup& setup, const std::string& host, std::uint16_t port,
                      const rdzv::ClientOptions& client) {
  setup.store_where = host + ":" + std::to_string(port);
  setup.connect = [host, port, client](bool again) -> std::unique_ptr<rdzv::Store> {
    rdzv::ClientOptions co = client;
    if (again) co.connect_timeout = std::chrono::milliseconds(1000);
    return std::make_unique<rdzv::StoreClient>(host, port, co);
  };
  rdzv::ClientOptions view = client;
  view.timeout = std::chrono::seconds(3);
  view.connect_timeout = std::chrono::seconds(1);
  setup.connect_view = [host, port, view]() -> std::unique_ptr<rdzv::Store> {
    return std::make_unique<rdzv::StoreClient>(host, port, view);
  };
}

StatusReporter::StatusReporter(StatusSetup setup) : s_(std::move(setup)) {
  node_.run_id = s_.run_id;
  node_.job_id = s_.job_id;
  node_.host = s_.host;
  node_.agent_pid = static_cast<int>(::getpid());
  node_.max_restarts = s_.max_restarts;
  node_.interval_s = s_.interval_s > 0 ? s_.interval_s : 1;
  started_ = status::unix_now();
  node_.started_unix = started_;
  node_.updated_unix = started_;
  if (s_.progress == ProgressMode::automatic) {
    s_.progress = ::isatty(STDERR_FILENO) ? ProgressMode::tty : ProgressMode::lines;
  }
}

StatusReporter::~StatusReporter() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (http_) http_->stop();
}

void StatusReporter::start() {
  sampler_ = std::make_unique<Sampler>();
  if (s_.connect && s_.interval_s > 0) {
    try {
      store_ = s_.connect(false);
      std::lock_guard<std::mutex> g(mu_);
      status::join(*store_, node_);
      sampler_->joined = true;
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "ddprun: status: cannot publish to the store at %s (%s); "
                   "the live status stays on this node\n",
                   s_.store_where.c_str(), e.what());
      store_.reset();
    }
  }
  if (s_.http_port >= 0) {
    status::ViewSources src;
    src.connect = s_.connect_view;
    src.default_run = s_.run_id;
    src.store_stats = s_.hosted_store_stats;
    src.local_node = [this] { return snapshot(); };
    views_ = std::make_unique<status::StatusViews>(std::move(src));
    status::HttpOptions ho;
    ho.host = s_.http_host.empty() ? "127.0.0.1" : s_.http_host;
    ho.port = static_cast<std::uint16_t>(s_.http_port);
    ho.token = s_.http_token;
    ho.tls_cert = s_.http_tls_cert;
    ho.tls_key = s_.http_tls_key;
    http_ = std::make_unique<status::HttpServer>(
        ho, [this](const status::HttpRequest& r) { return views_->handle(r); });
    http_->start();  // a port that cannot be bound is the user's error: ConfigError/IoError
    std::fprintf(stderr, "ddprun: live view at http%s://%s:%u/%s\n", ho.tls_cert.empty() ? "" : "s",
                 ho.host.c_str(), http_->port(),
                 ho.token.empty() ? "" : " (with the token: ?token=..., or Authorization: Bearer)");
  }
  thread_ = std::thread([this] { run(); });
}

int StatusReporter::http_port() const { return http_ ? http_->port() : -1; }

status::NodeStatus StatusReporter::snapshot() const {
  std::lock_guard<std::mutex> g(mu_);
  return node_;
}

void StatusReporter::phase(const std::string& name, const std::string& detail) {
  std::lock_guard<std::mutex> g(mu_);
  const double now = status::unix_now();
  if (!node_.phases.empty() && node_.phases.back().end_unix == 0) {
    node_.phases.back().end_unix = now;
  }
  if (!all_phases_.empty() && all_phases_.back().end_unix == 0) all_phases_.back().end_unix = now;
  node_.phases.push_back({name, now, 0, detail});
  trim_events(node_.phases);
  all_phases_.push_back(node_.phases.back());
  if (all_phases_.size() > kMaxTracePhases) all_phases_.erase(all_phases_.begin());
  if (name == "rendezvous") node_.state = "rendezvous";
  if (name == "run") node_.state = "running";
  if (name == "restart") node_.state = "restarting";
  if (name == "stop") node_.state = "stopping";
}

void StatusReporter::round_formed(int round, int group_rank, int group_world_size, int world_size,
                                  int restart_count) {
  std::lock_guard<std::mutex> g(mu_);
  node_.round = round;
  node_.group_rank = group_rank;
  node_.group_world_size = group_world_size;
  node_.world_size = world_size;
  node_.restart_count = restart_count;
}

void StatusReporter::workers_started(const std::vector<RankStart>& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  std::map<int, int> restarts;  // a local rank's count goes on across rounds
  std::map<int, status::RankStatus> before;
  for (const auto& r : node_.ranks) before[r.local_rank] = r;
  node_.ranks.clear();
  for (const auto& r : ranks) {
    status::RankStatus st;
    st.local_rank = r.local_rank;
    st.rank = r.rank;
    st.pid = static_cast<int>(r.pid);
    st.gpu = r.gpu;
    st.state = "running";
    if (auto it = before.find(r.local_rank); it != before.end()) {
      st.restarts = it->second.restarts + 1;
      st.last_exit = it->second.last_exit;
      st.last_error = it->second.last_error;
    }
    node_.ranks.push_back(st);
  }
  for (auto& [lr, t] : steps_) t.seen_last = -1;  // the new round's progress starts over
  for (auto& [lr, m] : metrics_) {
    m.seen_line = 0;
    m.seen_step = -1;
    m.told = false;
  }
}

void StatusReporter::worker_exited(int local_rank, int exit_code, const std::string& error,
                                   bool failed) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& r : node_.ranks) {
    if (r.local_rank != local_rank) continue;
    r.state = failed ? "failed" : "succeeded";
    r.last_exit = exit_code;
    if (failed) r.last_error = error;
    r.cpu_frac = 0;
  }
}

void StatusReporter::workers_stopped() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& r : node_.ranks) {
    if (r.state == "running" || r.state == "starting" || r.state == "hung") r.state = "stopped";
    r.cpu_frac = 0;
  }
}

void StatusReporter::hung(int local_rank) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& r : node_.ranks) {
    if (r.local_rank == local_rank && r.state == "running") r.state = "hung";
  }
}

void StatusReporter::progress(const std::map<int, RankProgress>& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& r : node_.ranks) {
    auto it = ranks.find(r.local_rank);
    if (it == ranks.end() || !it->second.reported) continue;
    const RankProgress& p = it->second;
    r.step = p.step;
    // Wall time per step (the interval between steps), not the compute phase that the
    // straggler check times: what a user means by step time and samples/s.
    // A span runs from one step line to the next: lines read together (no t=) are one span of
    // several steps, its time shared among them.
    std::vector<double> walls;
    for (std::size_t i = p.spans.size() > kStepHistory ? p.spans.size() - kStepHistory : 0;
         i < p.spans.size(); ++i) {
      const std::int64_t next = i + 1 < p.spans.size() ? p.spans[i + 1].step : p.step;
      const auto steps = static_cast<double>(std::max<std::int64_t>(1, next - p.spans[i].step));
      walls.push_back((p.spans[i].end_unix - p.spans[i].start_unix) / steps);
    }
    r.step_time_s = walls.empty() ? lower_median(p.step_s) : lower_median(walls);
    r.total_steps = p.total_steps;
    r.samples_per_s =
        p.samples >= 0 && r.step_time_s > 0 ? static_cast<double>(p.samples) / r.step_time_s : 0;
    take_metrics(r, p);
    RankTrace& t = steps_[r.local_rank];
    t.steps.rank = r.rank;
    // Only the spans not copied yet: those after the last step seen (newest last).
    std::size_t from = p.spans.size();
    while (from > 0 && p.spans[from - 1].step > t.seen_last) --from;
    for (std::size_t i = from; i < p.spans.size(); ++i) t.steps.steps.push_back(p.spans[i]);
    if (!p.spans.empty()) t.seen_last = std::max(t.seen_last, p.spans.back().step);
    if (t.steps.steps.size() > 2 * kTraceSteps) {
      t.steps.steps.erase(t.steps.steps.begin(), t.steps.steps.end() - kTraceSteps);
    }
  }
}

// The rank's latest metrics into its record, the new ones (and its samples/s at a new step)
// into its history. Called with mu_ held.
void StatusReporter::take_metrics(status::RankStatus& r, const RankProgress& p) {
  RankMetrics& m = metrics_[r.local_rank];
  if (p.metric_lines < m.seen_line) m.seen_line = 0;  // its pipe started over: a heal
  const double now = status::unix_now();
  r.metrics.clear();
  for (const auto& [key, v] : p.metrics) {
    r.metrics[key] = v.value;
    if (v.line > m.seen_line) m.history.add(key, v.step, now, v.value);
  }
  r.bad_metrics = p.bad_metrics;
  if (!m.told && !p.bad_metric.empty()) {
    m.told = true;
    std::fprintf(stderr,
                 "ddprun: local rank %d: progress metric %s; dropped (the rest are counted: "
                 "ddprun_rank_bad_metrics_total)\n",
                 r.local_rank, p.bad_metric.c_str());
  }
  m.seen_line = p.metric_lines;
  if (p.step != m.seen_step && r.samples_per_s > 0) {
    m.history.add("samples_per_s", p.step, now, r.samples_per_s);
  }
  m.seen_step = p.step;
}

std::size_t StatusReporter::history_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  std::size_t n = 0;
  for (const auto& [lr, m] : metrics_) n += m.history.bytes();
  return n;
}

void StatusReporter::restarting(int round, const std::string& cause, const std::string& what) {
  std::lock_guard<std::mutex> g(mu_);
  node_.restarts.push_back({round, status::unix_now(), cause, what});
  if (node_.restarts.size() > status::kMaxEvents) node_.restarts.erase(node_.restarts.begin());
}

void StatusReporter::failure(const std::string& cause) {
  std::lock_guard<std::mutex> g(mu_);
  ++node_.failures_by_cause[cause];
}

void StatusReporter::run() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto every = std::chrono::duration<double>(node_.interval_s);
  while (!stop_) {
    cv_.wait_for(lk, every, [this] { return stop_; });
    if (stop_) break;
    lk.unlock();
    sample_and_publish();
    lk.lock();
  }
}

void StatusReporter::sample_and_publish() {
  const double now = status::unix_now();
  std::vector<std::pair<int, int>> pids;  // (pid, gpu)
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& r : node_.ranks) {
      if (r.state == "running" || r.state == "hung") pids.emplace_back(r.pid, r.gpu);
    }
  }
  std::map<int, std::pair<double, std::uint64_t>> cpu_rss;
  std::map<int, GpuReading> gpu;
  const double hz = static_cast<double>(clock_ticks_per_second());
  for (auto [pid, dev] : pids) {
    if (auto ps = sample_process(pid)) {
      auto& last = sampler_->cpu[pid];
      double frac = 0;
      if (last.second > 0 && now > last.second && ps->cpu_ticks >= last.first) {
        frac = static_cast<double>(ps->cpu_ticks - last.first) / hz / (now - last.second);
      }
      last = {ps->cpu_ticks, now};
      cpu_rss[pid] = {frac, ps->rss_bytes};
    }
    if (dev >= 0 && sampler_->gpus.available()) {
      if (auto r = sampler_->gpus.read(dev)) gpu[dev] = *r;
    }
  }
  status::NodeStatus copy;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& r : node_.ranks) {
      if (auto it = cpu_rss.find(r.pid); it != cpu_rss.end()) {
        r.cpu_frac = it->second.first;
        r.rss_bytes = it->second.second;
      }
      if (auto it = gpu.find(r.gpu); it != gpu.end()) {
        r.gpu_util = it->second.util;
        r.gpu_mem_used = it->second.mem_used;
        r.gpu_mem_total = it->second.mem_total;
      }
    }
    node_.updated_unix = now;
    std::vector<status::Series> per_rank;
    per_rank.reserve(metrics_.size());
    for (const auto& [lr, m] : metrics_)
      per_rank.push_back(m.history.series(2 * status::kRecordPoints));
    std::vector<const status::Series*> sources;
    for (const auto& sr : per_rank) sources.push_back(&sr);
    node_.history = status::combine(sources, status::kRecordPoints);
    node_.history_bytes = 0;
    for (const auto& [lr, m] : metrics_) node_.history_bytes += m.history.bytes();
    if (away_since_ > 0) {  // the current outage goes on
      node_.store_away_s = std::max(0.0, now - away_since_);
      node_.store_outage_s = outages_ended_s_ + node_.store_away_s;
    }
    copy = node_;
  }
  if (!store_ && sampler_->joined && now >= sampler_->reconnect_at) {
    // The store went away (restarted, stopped, cut off): try again every few seconds, briefly.
    try {
      auto fresh = s_.connect(true);
      status::rejoin(*fresh, copy);
      store_ = std::move(fresh);
      std::lock_guard<std::mutex> g(mu_);
      node_.seq = copy.seq;
    } catch (const Error&) {
      sampler_->reconnect_at = now + std::min(5.0, 0.5 * ++sampler_->reconnects);
    }
  } else if (store_) {
    try {
      status::publish(*store_, copy, now);
      sampler_->reconnects = 0;
      std::lock_guard<std::mutex> g(mu_);
      node_.seq = copy.seq;
    } catch (const Error&) {
      store_.reset();  // the agent says the store is away; publishing resumes when it is back
    }
  }
  draw_progress(copy, now);
}

void StatusReporter::healed(double seconds, const std::string& what) {
  std::lock_guard<std::mutex> g(mu_);
  ++node_.heals;
  node_.heal_s += seconds;
  node_.last_heal = what;
  // The trace: a "heal" span from the death to the replacement's first step, inside the run
  // phase; the open phase stays last, for phase() to close.
  const double now = status::unix_now();
  status::Phase heal{"heal", now - std::max(0.0, seconds), now, what};
  auto at = all_phases_.end();
  if (!all_phases_.empty() && all_phases_.back().end_unix == 0) --at;
  all_phases_.insert(at, std::move(heal));
  if (all_phases_.size() > kMaxTracePhases) all_phases_.erase(all_phases_.begin());
}

void StatusReporter::store_outage(int count, double total_s, double away_s) {
  std::lock_guard<std::mutex> g(mu_);
  node_.store_outages = count;
  node_.store_outage_s = total_s;
  node_.store_away_s = away_s;
  away_since_ = away_s >= 0 ? status::unix_now() - away_s : 0;
  outages_ended_s_ = total_s - std::max(0.0, away_s);
}

void StatusReporter::draw_progress(const status::NodeStatus& copy, double now) {
  if (s_.progress == ProgressMode::off || copy.state != "running") return;
  const std::string line = format_progress_line(copy);
  if (line.empty()) return;
  if (s_.progress == ProgressMode::tty) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
    tty_line_ = true;
  } else if (sampler_->last_line < 0 || now - sampler_->last_line >= kLinesEvery) {
    std::fprintf(stderr, "%s\n", line.c_str());
    sampler_->last_line = now;
  }
}

}  // namespace ddp::launch
