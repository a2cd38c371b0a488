// The status records' JSON codec (schema docs/status.schema.json) and the readers' derived
// fields. Field names are the schema's; unknown fields are ignored (newer agents may add some),
// a missing or mistyped required field is a ProtocolError that names it.
#include "ddp/status/record.hpp"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"

namespace ddp::status {

using nlohmann::json;

namespace {

json rank_json(const RankStatus& r) {
  json j = {{"local_rank", r.local_rank},
            {"rank", r.rank},
            {"pid", r.pid},
            {"state", r.state},
            {"restarts", r.restarts},
            {"step", r.step},
            {"step_time_s", r.step_time_s},
            {"samples_per_s", r.samples_per_s},
            {"total_steps", r.total_steps},
            {"cpu", r.cpu_frac},
            {"rss_bytes", r.rss_bytes},
            {"gpu", r.gpu},
            {"last_error", r.last_error}};
  j["last_exit"] = r.last_exit ? json(*r.last_exit) : json(nullptr);
  j["gpu_util"] = r.gpu_util ? json(*r.gpu_util) : json(nullptr);
  j["gpu_mem_used"] = r.gpu_mem_used ? json(*r.gpu_mem_used) : json(nullptr);
  j["gpu_mem_total"] = r.gpu_mem_total ? json(*r.gpu_mem_total) : json(nullptr);
  j["metrics"] = r.metrics;
  j["bad_metrics"] = r.bad_metrics;
  return j;
}

// {"loss": [[step, unix, value], ...], ...}
json series_json(const Series& s) {
  json j = json::object();
  for (const auto& [key, pts] : s) {
    json a = json::array();
    for (const MetricPoint& p : pts) a.push_back(json::array({p.step, p.unix, p.value}));
    j[key] = std::move(a);
  }
  return j;
}

json node_json(const NodeStatus& n, bool history) {
  json ranks = json::array();
  for (const auto& r : n.ranks) ranks.push_back(rank_json(r));
  json restarts = json::array();
  for (const auto& e : n.restarts) {
    restarts.push_back(
        {{"round", e.round}, {"at", e.at_unix}, {"cause", e.cause}, {"what", e.what}});
  }
  json phases = json::array();
  for (const auto& p : n.phases) {
    phases.push_back(
        {{"name", p.name}, {"start", p.start_unix}, {"end", p.end_unix}, {"detail", p.detail}});
  }
  json j = {{"schema", n.schema},
            {"run_id", n.run_id},
            {"job_id", n.job_id},
            {"host", n.host},
            {"slot", n.slot},
            {"agent_pid", n.agent_pid},
            {"state", n.state},
            {"round", n.round},
            {"group_rank", n.group_rank},
            {"group_world_size", n.group_world_size},
            {"world_size", n.world_size},
            {"restart_count", n.restart_count},
            {"max_restarts", n.max_restarts},
            {"started", n.started_unix},
            {"updated", n.updated_unix},
            {"interval_s", n.interval_s},
            {"seq", n.seq},
            {"lost", n.lost},
            {"ranks", std::move(ranks)},
            {"restarts", std::move(restarts)},
            {"failures_by_cause", n.failures_by_cause},
            {"phases", std::move(phases)},
            {"store_outages", n.store_outages},
            {"store_outage_s", n.store_outage_s},
            {"store_away_s", n.store_away_s},
            {"heals", n.heals},
            {"heal_s", n.heal_s},
            {"last_heal", n.last_heal},
            {"history_bytes", n.history_bytes}};
  if (history) j["history"] = series_json(n.history);
  return j;
}

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  DDP_THROW(ProtocolError, "bad status record: " + path + " " + why);
}

const json& need(const json& o, const char* key, const std::string& path) {
  if (!o.is_object()) bad(path, "is not an object");
  auto it = o.find(key);
  if (it == o.end()) bad(path + "." + key, "is missing");
  return *it;
}

template <typename T>
T num(const json& o, const char* key, const std::string& path) {
  const json& v = need(o, key, path);
  if (!v.is_number()) bad(path + "." + key, "is not a number");
  return v.get<T>();
}

std::string str(const json& o, const char* key, const std::string& path) {
  const json& v = need(o, key, path);
  if (!v.is_string()) bad(path + "." + key, "is not a string");
  return v.get<std::string>();
}

template <typename T>
std::optional<T> opt(const json& o, const char* key, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) bad(path + "." + key, "is not a number or null");
  return it->get<T>();
}

const json& arr(const json& o, const char* key, const std::string& path) {
  const json& v = need(o, key, path);
  if (!v.is_array()) bad(path + "." + key, "is not an array");
  return v;
}

RankStatus rank_from(const json& j, const std::string& p) {
  RankStatus r;
  r.local_rank = num<int>(j, "local_rank", p);
  r.rank = num<int>(j, "rank", p);
  r.pid = num<int>(j, "pid", p);
  r.state = str(j, "state", p);
  r.restarts = num<int>(j, "restarts", p);
  r.last_exit = opt<int>(j, "last_exit", p);
  r.last_error = str(j, "last_error", p);
  r.step = num<std::int64_t>(j, "step", p);
  r.step_time_s = num<double>(j, "step_time_s", p);
  r.samples_per_s = num<double>(j, "samples_per_s", p);
  r.total_steps = num<std::int64_t>(j, "total_steps", p);
  r.cpu_frac = num<double>(j, "cpu", p);
  r.rss_bytes = num<std::uint64_t>(j, "rss_bytes", p);
  r.gpu = num<int>(j, "gpu", p);
  r.gpu_util = opt<double>(j, "gpu_util", p);
  r.gpu_mem_used = opt<std::uint64_t>(j, "gpu_mem_used", p);
  r.gpu_mem_total = opt<std::uint64_t>(j, "gpu_mem_total", p);
  if (auto it = j.find("metrics"); it != j.end()) {  // absent before metrics (issue 36)
    if (!it->is_object()) bad(p + ".metrics", "is not an object");
    for (const auto& [k, v] : it->items()) {
      if (!v.is_number() || !metric_name_ok(k)) bad(p + ".metrics." + k, "is not a metric");
      r.metrics[k] = v.get<double>();
    }
    r.bad_metrics = opt<std::uint64_t>(j, "bad_metrics", p).value_or(0);
  }
  return r;
}

Series series_from(const json& j, const std::string& p) {
  if (!j.is_object()) bad(p, "is not an object");
  Series s;
  for (const auto& [key, pts] : j.items()) {
    const std::string q = p + "." + key;
    if (!metric_name_ok(key) && key != "samples_per_s") bad(q, "is not a metric name");
    if (!pts.is_array() || pts.size() > kHistoryPoints) bad(q, "is not an array of points");
    auto& dst = s[key];
    for (const json& pt : pts) {
      if (!pt.is_array() || pt.size() != 3 || !pt[0].is_number() || !pt[1].is_number() ||
          !pt[2].is_number()) {
        bad(q, "has a point that is not [step, time, value]");
      }
      dst.push_back({pt[0].get<std::int64_t>(), pt[1].get<double>(), pt[2].get<double>()});
    }
  }
  return s;
}

NodeStatus node_from(const json& j, const std::string& p) {
  NodeStatus n;
  n.schema = num<int>(j, "schema", p);
  if (n.schema != kSchemaVersion) {
    bad(p + ".schema", std::to_string(n.schema) + " is not the version this reader knows (" +
                           std::to_string(kSchemaVersion) + ")");
  }
  n.run_id = str(j, "run_id", p);
  n.job_id = str(j, "job_id", p);
  n.host = str(j, "host", p);
  n.slot = num<int>(j, "slot", p);
  n.agent_pid = num<int>(j, "agent_pid", p);
  n.state = str(j, "state", p);
  n.round = num<int>(j, "round", p);
  n.group_rank = num<int>(j, "group_rank", p);
  n.group_world_size = num<int>(j, "group_world_size", p);
  n.world_size = num<int>(j, "world_size", p);
  n.restart_count = num<int>(j, "restart_count", p);
  n.max_restarts = num<int>(j, "max_restarts", p);
  n.started_unix = num<double>(j, "started", p);
  n.updated_unix = num<double>(j, "updated", p);
  n.interval_s = num<double>(j, "interval_s", p);
  n.seq = num<std::uint64_t>(j, "seq", p);
  if (auto it = j.find("lost"); it != j.end() && it->is_boolean()) n.lost = it->get<bool>();
  // Absent in records of agents before the outage fields: no outage seen.
  if (j.contains("store_outages")) {
    n.store_outages = num<int>(j, "store_outages", p);
    n.store_outage_s = num<double>(j, "store_outage_s", p);
    n.store_away_s = num<double>(j, "store_away_s", p);
  }
  if (j.contains("heals")) {  // absent in records of agents before in-place recovery
    n.heals = num<int>(j, "heals", p);
    n.heal_s = num<double>(j, "heal_s", p);
    if (auto it = j.find("last_heal"); it != j.end() && it->is_string()) {
      n.last_heal = it->get<std::string>();
    }
  }
  if (auto it = j.find("history"); it != j.end()) n.history = series_from(*it, p + ".history");
  n.history_bytes = opt<std::uint64_t>(j, "history_bytes", p).value_or(0);
  const json& ranks = arr(j, "ranks", p);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    n.ranks.push_back(rank_from(ranks[i], p + ".ranks[" + std::to_string(i) + "]"));
  }
  const json& restarts = arr(j, "restarts", p);
  for (std::size_t i = 0; i < restarts.size(); ++i) {
    const std::string q = p + ".restarts[" + std::to_string(i) + "]";
    n.restarts.push_back({num<int>(restarts[i], "round", q), num<double>(restarts[i], "at", q),
                          str(restarts[i], "cause", q), str(restarts[i], "what", q)});
  }
  const json& f = need(j, "failures_by_cause", p);
  if (!f.is_object()) bad(p + ".failures_by_cause", "is not an object");
  for (const auto& [k, v] : f.items()) {
    if (!v.is_number_integer()) bad(p + ".failures_by_cause." + k, "is not an integer");
    n.failures_by_cause[k] = v.get<int>();
  }
  const json& phases = arr(j, "phases", p);
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const std::string q = p + ".phases[" + std::to_string(i) + "]";
    n.phases.push_back({str(phases[i], "name", q), num<double>(phases[i], "start", q),
                        num<double>(phases[i], "end", q), str(phases[i], "detail", q)});
  }
  return n;
}

json parse(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) DDP_THROW(ProtocolError, std::string("bad ") + what + ": not JSON");
  return j;
}

}  // namespace

bool final_state(const std::string& s) {
  return s == "succeeded" || s == "failed" || s == "stopped";
}

void fill_derived(JobStatus& job) {
  job.round = -1;
  job.members = 0;
  job.ranks = 0;
  job.restarts = 0;
  std::set<std::string> states;
  for (auto& n : job.nodes) {
    const double stale = 3 * n.interval_s + 2;
    n.lost = !final_state(n.state) && job.now_unix - n.updated_unix > stale;
    if (n.lost) {
      for (auto& r : n.ranks) r.state = "lost";
    }
    job.round = std::max(job.round, n.round);
    job.restarts = std::max(job.restarts, n.restart_count);
  }
  for (const auto& n : job.nodes) {
    if (n.lost || n.round != job.round) continue;
    if (final_state(n.state) && n.ranks.empty()) continue;
    ++job.members;
    job.ranks += static_cast<int>(n.ranks.size());
    states.insert(n.state);
  }
  fill_summary(job);
  if (states.empty()) {
    job.state = job.nodes.empty() ? "unknown" : "lost";
  } else if (states.size() == 1) {
    job.state = *states.begin();
  } else if (states.count("failed")) {
    job.state = "failed";
  } else {
    job.state = "mixed";
  }
}

std::string to_json(const Series& s) {
  return series_json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

Series series_from_json(const std::string& text) {
  return series_from(parse(text, "metric history"), "history");
}

std::string to_json(const NodeStatus& n, bool history) {
  return node_json(n, history).dump(-1, ' ', false, json::error_handler_t::replace);
}

NodeStatus node_from_json(const std::string& text, bool history) {
  // Published records carry no history (job_view.hpp: it has a key of its own); one that does
  // (an agent's local view, a test's record) keeps it unless the reader does not want it.
  NodeStatus n = node_from(parse(text, "status record"), "node");
  if (!history) n.history.clear();
  return n;
}

std::string to_json(const JobStatus& job, int indent, bool history) {
  json nodes = json::array();
  for (const auto& n : job.nodes) nodes.push_back(node_json(n, history));
  json j = {{"schema", job.schema},
            {"run_id", job.run_id},
            {"now", job.now_unix},
            {"round", job.round},
            {"members", job.members},
            {"ranks", job.ranks},
            {"restarts", job.restarts},
            {"state", job.state},
            {"step", job.step},
            {"total_steps", job.total_steps},
            {"samples_per_s", job.samples_per_s},
            {"metrics", job.metrics},
            {"eta_s", job.eta_s},
            {"wall_s", job.wall_s},
            {"lost_s", job.lost_s},
            {"goodput", job.goodput},
            {"nodes", std::move(nodes)}};
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

JobStatus job_from_json(const std::string& text) {
  const json j = parse(text, "job status");
  JobStatus job;
  job.schema = num<int>(j, "schema", "job");
  job.run_id = str(j, "run_id", "job");
  job.now_unix = num<double>(j, "now", "job");
  job.round = num<int>(j, "round", "job");
  job.members = num<int>(j, "members", "job");
  job.ranks = num<int>(j, "ranks", "job");
  job.restarts = num<int>(j, "restarts", "job");
  job.state = str(j, "state", "job");
  if (j.contains("goodput")) {  // absent before the job summary (issue 36)
    job.step = num<std::int64_t>(j, "step", "job");
    job.total_steps = num<std::int64_t>(j, "total_steps", "job");
    job.samples_per_s = num<double>(j, "samples_per_s", "job");
    job.eta_s = num<double>(j, "eta_s", "job");
    job.wall_s = num<double>(j, "wall_s", "job");
    job.lost_s = num<double>(j, "lost_s", "job");
    job.goodput = num<double>(j, "goodput", "job");
    if (auto it = j.find("metrics"); it != j.end() && it->is_object()) {
      for (const auto& [k, v] : it->items()) {
        if (v.is_number()) job.metrics[k] = v.get<double>();
      }
    }
  }
  const json& nodes = arr(j, "nodes", "job");
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    job.nodes.push_back(node_from(nodes[i], "job.nodes[" + std::to_string(i) + "]"));
  }
  return job;
}

}  // namespace ddp::status
