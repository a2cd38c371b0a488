// Prometheus text exposition (format 0.0.4) of the jobs' status records and, where the process
// serves a store, the store's own counters. Pure: no sockets. Metric names: docs/metrics.md.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/rdzv/server.hpp"
#include "ddp/status/record.hpp"

namespace ddp::status {

// The Content-Type of what render_metrics returns.
inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every family with # HELP and # TYPE, in a fixed order; within one, jobs by run id, nodes by
// slot, ranks by local rank. The jobs are taken as given: readers call fill_derived first
// (read_job does), so lost nodes are marked and the job's round, members and ranks are set.
// A family with no sample is left out, except ddprun_jobs (always present).
std::string render_metrics(const std::vector<JobStatus>& jobs,
                           const std::optional<rdzv::ServerStats>& store);

// A label value as the format writes it between quotes: \ " and newline escaped.
std::string escape_label_value(std::string_view value);

}  // namespace ddp::status
