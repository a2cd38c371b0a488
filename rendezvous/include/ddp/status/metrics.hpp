// Prometheus text exposition (format 0.0.4) of the jobs' status records and, where the process
// serves a store, the store's own counters. Pure: no sockets. Metric names: docs/status.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ddp/rdzv/server.hpp"
#include "ddp/status/record.hpp"

namespace ddp::status {

std::string render_metrics(const std::vector<JobStatus>& jobs,
                           const std::optional<rdzv::ServerStats>& store);

}  // namespace ddp::status
