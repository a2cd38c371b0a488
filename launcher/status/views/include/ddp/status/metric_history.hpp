// The numbers a training reports (loss, samples/s, the learning rate: any key=value on its
// progress line) kept over the whole run in bounded memory, and combined across ranks and nodes
// for the views (docs/status.md, "Metrics"). Pure: no clock, no I/O.
//
// A MetricHistory holds, per metric, at most `capacity` points (step, wall clock, value). When a
// series is full it drops every second point and from then on keeps one point in two of those
// offered (then one in four, ...): the whole run stays covered at a coarser resolution, and the
// memory is bounded by keys x capacity points whatever the run's length. The newest value of
// every metric is always kept apart (latest()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/proto/metric_name.hpp"

namespace ddp::status {

inline constexpr std::size_t kHistoryPoints = 512;  // points kept per metric by an agent
inline constexpr std::size_t kRecordPoints = 64;    // points per metric in a published record

struct MetricPoint {
  std::int64_t step = 0;
  double unix = 0;
  double value = 0;
};

// A set of series, as records carry them: keys, and per key its points oldest first.
using Series = std::map<std::string, std::vector<MetricPoint>>;

class MetricHistory {
 public:
  explicit MetricHistory(std::size_t capacity = kHistoryPoints,
                         std::size_t max_keys = kMaxRankMetrics);
  // One point of `key`. A key past max_keys is dropped and counted (dropped_keys()).
  void add(const std::string& key, std::int64_t step, double unix, double value);
  const std::map<std::string, double>& latest() const { return latest_; }
  // The kept points and the newest, at most max_points per metric (thin()).
  Series series(std::size_t max_points = static_cast<std::size_t>(-1)) const;
  std::size_t dropped_keys() const { return dropped_keys_; }
  std::size_t points() const;  // kept now, all metrics together
  // An upper bound of the memory the points take (not the map's own nodes).
  std::size_t bytes() const;

 private:
  struct Line {
    std::vector<MetricPoint> points;
    std::uint64_t stride = 1;  // keep one point in `stride` offered
    std::uint64_t offered = 0;
    MetricPoint newest;  // the last point offered, kept or not
  };
  std::size_t capacity_;
  std::size_t max_keys_;
  std::map<std::string, Line> lines_;
  std::map<std::string, double> latest_;
  std::size_t dropped_keys_ = 0;
};

// At most n points of a series, evenly spaced, the first and the last kept.
std::vector<MetricPoint> thin(const std::vector<MetricPoint>& points, std::size_t n);

// Several sources' series (ranks of a node, nodes of a job) as one: for each metric, on the
// wall-clock grid of the source with the most points for it, each source's last value at or
// before the grid point, summed for throughput metrics and averaged otherwise (sources with no
// value yet left out). The step is the grid source's. At most n points per metric.
Series combine(const std::vector<const Series*>& sources, std::size_t n);

}  // namespace ddp::status
