// /api/history's answers (docs/status.md, "Metrics"): the job's metric curves (its nodes'
// histories combined, metric_history.hpp) and each node's, as JSON for the page, or one row per
// point as CSV or JSON lines for a user's own plots and archives. Pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ddp/status/record.hpp"

namespace ddp::status {

enum class HistoryFormat { json_object, csv, json_lines };
enum class HistoryScope { job, nodes, all };

// "json", "csv", "jsonl" / "job", "nodes", "all"; nullopt for anything else.
std::optional<HistoryFormat> parse_history_format(std::string_view text);
std::optional<HistoryScope> parse_history_scope(std::string_view text);

// The job's curves: its live nodes' histories combined, at most kRecordPoints per metric.
Series job_history(const JobStatus& job);

// JSON: {"run_id", "now", "job": {metric: [[step, time, value], ...]}, "nodes": [{"slot",
// "host", "history"}], "restarts": [{"at", "slot", "cause"}]} (job or nodes per scope).
// CSV: "scope,slot,host,metric,step,time,value" then one row per point (slot and host empty
// for the job); JSON lines: one object per point with those names.
std::string export_history(const JobStatus& job, HistoryFormat format, HistoryScope scope);

}  // namespace ddp::status
