// See history_export.hpp. CSV fields are quoted only when they must be (a host name with a
// comma or a quote); numbers are written as JSON writes them.
#include "ddp/status/history_export.hpp"

#include <nlohmann/json.hpp>

#include <vector>

namespace ddp::status {

using nlohmann::json;

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string number(double v) { return json(v).dump(); }

// Calls row(scope, node or null, metric, point) for every point the scope covers.
template <typename Row>
void each_point(const JobStatus& job, HistoryScope scope, const Series& whole, Row row) {
  if (scope != HistoryScope::nodes) {
    for (const auto& [key, pts] : whole) {
      for (const MetricPoint& p : pts) row("job", nullptr, key, p);
    }
  }
  if (scope == HistoryScope::job) return;
  for (const NodeStatus& n : job.nodes) {
    for (const auto& [key, pts] : n.history) {
      for (const MetricPoint& p : pts) row("node", &n, key, p);
    }
  }
}

}  // namespace

std::optional<HistoryFormat> parse_history_format(std::string_view text) {
  if (text == "json") return HistoryFormat::json_object;
  if (text == "csv") return HistoryFormat::csv;
  if (text == "jsonl") return HistoryFormat::json_lines;
  return std::nullopt;
}

std::optional<HistoryScope> parse_history_scope(std::string_view text) {
  if (text == "job") return HistoryScope::job;
  if (text == "nodes") return HistoryScope::nodes;
  if (text == "all") return HistoryScope::all;
  return std::nullopt;
}

Series job_history(const JobStatus& job) {
  std::vector<const Series*> sources;
  for (const NodeStatus& n : job.nodes) {
    if (!n.history.empty()) sources.push_back(&n.history);
  }
  return combine(sources, kRecordPoints);
}

std::string export_history(const JobStatus& job, HistoryFormat format, HistoryScope scope) {
  const Series whole = scope == HistoryScope::nodes ? Series{} : job_history(job);
  if (format == HistoryFormat::json_object) {
    json head = {{"run_id", job.run_id}, {"now", job.now_unix}};
    json restarts = json::array();
    for (const NodeStatus& n : job.nodes) {
      for (const RestartEvent& e : n.restarts) {
        restarts.push_back({{"at", e.at_unix}, {"slot", n.slot}, {"cause", e.cause}});
      }
    }
    head["restarts"] = std::move(restarts);
    std::string out = head.dump(-1, ' ', false, json::error_handler_t::replace);
    out.pop_back();  // the closing brace: the series follow, written by record.cpp's codec
    if (scope != HistoryScope::nodes) out += ",\"job\":" + to_json(whole);
    if (scope != HistoryScope::job) {
      out += ",\"nodes\":[";
      for (std::size_t i = 0; i < job.nodes.size(); ++i) {
        const NodeStatus& n = job.nodes[i];
        json id = {{"slot", n.slot}, {"host", n.host}};
        std::string item = id.dump(-1, ' ', false, json::error_handler_t::replace);
        item.pop_back();
        out += (i ? "," : "") + item + ",\"history\":" + to_json(n.history) + "}";
      }
      out += "]";
    }
    return out + "}\n";
  }
  std::string out;
  if (format == HistoryFormat::csv) out = "scope,slot,host,metric,step,time,value\n";
  each_point(
      job, scope, whole,
      [&](const char* what, const NodeStatus* n, const std::string& key, const MetricPoint& p) {
        if (format == HistoryFormat::csv) {
          out += std::string(what) + ',' + (n ? std::to_string(n->slot) : "") + ',' +
                 (n ? csv_field(n->host) : "") + ',' + key + ',' + std::to_string(p.step) + ',' +
                 number(p.unix) + ',' + number(p.value) + '\n';
        } else {
          json row = {{"scope", what},
                      {"slot", n ? json(n->slot) : json(nullptr)},
                      {"host", n ? json(n->host) : json(nullptr)},
                      {"metric", key},
                      {"step", p.step},
                      {"time", p.unix},
                      {"value", p.value}};
          out += row.dump(-1, ' ', false, json::error_handler_t::replace) + '\n';
        }
      });
  return out;
}

}  // namespace ddp::status
