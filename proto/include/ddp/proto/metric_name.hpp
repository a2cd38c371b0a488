// The metrics a worker reports on its progress line ("step=12 loss=2.31 lr=3e-4 ...", issue 36;
// docs/status.md, "Metrics"): what a metric's name may be and how the views add them up, shared
// by the agent's parser, the status records and the worker's writer. Pure.
#pragma once

#include <cstddef>
#include <string_view>

namespace ddp {

inline constexpr std::size_t kMaxMetricName = 48;   // bytes in a metric's name
inline constexpr std::size_t kMaxRankMetrics = 16;  // metrics kept per rank (more: dropped)

// [A-Za-z_][A-Za-z0-9_.-]*, at most kMaxMetricName bytes.
bool metric_name_ok(std::string_view name);
// Throughput adds up across ranks: samples_per_s, and any name ending in "_per_s"; every other
// metric is averaged.
bool is_throughput_metric(std::string_view name);

}  // namespace ddp
