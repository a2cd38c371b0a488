// The status endpoints (views.hpp): routes, the query's run id, and a store client that is
// dropped on any error and made again on the next request.
#include "ddp/status/views.hpp"

#include <nlohmann/json.hpp>

#include <utility>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/log.hpp"
#include "ddp/rdzv/store.hpp"
#include "ddp/status/history_export.hpp"
#include "ddp/status/job_view.hpp"
#include "ddp/status/metrics.hpp"
#include "ddp/status/page.hpp"

namespace ddp::status {

namespace {

constexpr const char* kJson = "application/json";
constexpr const char* kMetrics = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::size_t kMetricsRuns = 64;  // ddprund's /metrics: the newest runs

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

HttpResponse json_error(int status, const std::string& message) {
  return {status, kJson, dump({{"error", message}})};
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

QueryParam query_param(std::string_view query, std::string_view name, std::size_t max_bytes) {
  QueryParam out;
  std::size_t at = 0;
  while (at <= query.size()) {
    std::size_t end = query.find('&', at);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view item = query.substr(at, end - at);
    at = end + 1;
    const std::size_t eq = item.find('=');
    if (item.substr(0, eq) != name) continue;
    const std::string_view raw = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    std::string value;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      char c = raw[i];
      if (c == '+') {
        c = ' ';
      } else if (c == '%') {
        const bool whole = i + 2 < raw.size();
        const int hi = whole ? hex_digit(raw[i + 1]) : -1;
        const int lo = whole ? hex_digit(raw[i + 2]) : -1;
        if (hi < 0 || lo < 0) {
          out.error = "'" + std::string(name) + "': a bad percent escape";
          return out;
        }
        c = static_cast<char>(hi * 16 + lo);
        i += 2;
      }
      const auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20 || byte == 0x7f) {
        out.error = "'" + std::string(name) + "': a control character";
        return out;
      }
      if (value.size() == max_bytes) {
        out.error =
            "'" + std::string(name) + "': longer than " + std::to_string(max_bytes) + " bytes";
        return out;
      }
      value.push_back(c);
    }
    out.value = std::move(value);
    return out;
  }
  return out;
}

StatusViews::StatusViews(ViewSources sources) : s_(std::move(sources)) {}
StatusViews::~StatusViews() = default;

HttpResponse StatusViews::handle(const HttpRequest& request) {
  if (request.path == "/" || request.path == "/index.html") {
    return {200, "text/html; charset=utf-8", std::string(status_page_html())};
  }
  if (request.path == "/api/status") return api_status(request);
  if (request.path == "/api/history") return api_history(request);
  if (auto js = status_page_asset(request.path); !js.empty()) {
    return {200, "text/javascript; charset=utf-8", std::string(js)};
  }
  if (request.path == "/api/runs") return api_runs();
  if (request.path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (request.path == "/metrics") return metrics();
  return {404, "text/plain; charset=utf-8", "not found\n"};
}

bool StatusViews::with_store(const std::function<void(rdzv::Store&)>& f) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool fresh = false;
    try {
      if (!store_) {
        if (!s_.connect) return false;
        fresh = true;
        store_ = s_.connect();
        if (!store_) return false;
      }
      f(*store_);
      if (store_failing_) logger("http").info("the status views reach the store again");
      store_failing_ = false;
      return true;
    } catch (const Error& e) {
      store_.reset();
      if (fresh) {
        if (!store_failing_) {
          logger("http").warn("the status views cannot read the store: {}", e.what());
        }
        store_failing_ = true;
        return false;
      }
    }
  }
  return false;
}

JobStatus StatusViews::local_job() {
  JobStatus job;
  job.now_unix = unix_now();
  NodeStatus n = s_.local_node();
  n.updated_unix = job.now_unix;  // this node is alive: it is the one answering
  job.run_id = n.run_id;
  job.nodes.push_back(std::move(n));
  fill_derived(job);
  return job;
}

std::optional<HttpResponse> StatusViews::read_run(const HttpRequest& request, JobStatus& job,
                                                  bool history) {
  const QueryParam run = query_param(request.query, "run");
  if (!run.error.empty()) return json_error(400, "bad query parameter " + run.error);
  const bool agent = static_cast<bool>(s_.local_node);
  std::string id = run.value && !run.value->empty() ? *run.value : s_.default_run;
  std::string own_run;
  if (agent) {
    own_run = s_.local_node().run_id;
    if (id.empty()) id = own_run;
  }
  const bool reached = with_store([&](rdzv::Store& store) {
    if (id.empty()) {
      const auto runs = list_runs(store);
      if (runs.empty()) return;
      id = runs.back();
    }
    job = read_job(store, id, unix_now(), history);
  });
  // An agent always knows its own node, whatever the store says.
  if (agent && id == own_run && (!reached || job.nodes.empty())) job = local_job();
  if (!reached && job.nodes.empty()) return json_error(503, "the store cannot be reached");
  if (id.empty()) return json_error(404, "no run has published its status yet");
  if (job.nodes.empty()) return json_error(404, "unknown run '" + id + "'");
  return std::nullopt;
}

HttpResponse StatusViews::api_status(const HttpRequest& request) {
  // Compact unless ?pretty: a 1024-node job's answer is megabytes (docs/perf.md). The nodes'
  // metric histories only with ?history (api/history has them, combined).
  const bool pretty = query_param(request.query, "pretty").value.has_value();
  const bool history = query_param(request.query, "history").value.has_value();
  JobStatus job;
  if (auto error = read_run(request, job, history)) return *error;
  return {200, kJson, to_json(job, pretty ? 2 : -1, history) + "\n"};
}

HttpResponse StatusViews::api_history(const HttpRequest& request) {
  const QueryParam format = query_param(request.query, "format", 16);
  const QueryParam scope = query_param(request.query, "scope", 16);
  const auto f = parse_history_format(format.value.value_or("json"));
  if (!format.error.empty() || !f) {
    return json_error(400, "bad query parameter 'format': '" + format.value.value_or("") +
                               "' is not json, csv or jsonl");
  }
  const auto sc =
      parse_history_scope(scope.value.value_or(*f == HistoryFormat::json_object ? "job" : "all"));
  if (!scope.error.empty() || !sc) {
    return json_error(400, "bad query parameter 'scope': '" + scope.value.value_or("") +
                               "' is not job, nodes or all");
  }
  JobStatus job;
  if (auto error = read_run(request, job, true)) return *error;
  const char* type = *f == HistoryFormat::csv          ? "text/csv; charset=utf-8"
                     : *f == HistoryFormat::json_lines ? "application/x-ndjson"
                                                       : kJson;
  return {200, type, export_history(job, *f, *sc)};
}

HttpResponse StatusViews::api_runs() {
  std::vector<std::string> runs;
  const bool reached = with_store([&](rdzv::Store& store) { runs = list_runs(store); });
  if (!reached) {
    if (!s_.local_node) return json_error(503, "the store cannot be reached");
    runs = {s_.local_node().run_id};
  }
  return {200, kJson, dump({{"runs", runs}})};
}

HttpResponse StatusViews::metrics() {
  std::optional<rdzv::ServerStats> stats;
  if (s_.store_stats) stats = s_.store_stats();
  std::vector<JobStatus> jobs;
  if (s_.local_node) {
    jobs.push_back(local_job());
  } else {
    with_store([&](rdzv::Store& store) {
      jobs.clear();
      const double now = unix_now();
      for (const auto& id : list_runs(store, kMetricsRuns))
        jobs.push_back(read_job(store, id, now));
    });
  }
  return {200, kMetrics, render_metrics(jobs, stats)};
}

}  // namespace ddp::status
