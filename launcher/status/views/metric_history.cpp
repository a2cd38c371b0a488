// See metric_history.hpp: bounded series by halving, even thinning, and the time-grid combine.
#include "ddp/status/metric_history.hpp"

#include <algorithm>

#include "ddp/proto/metric_name.hpp"

namespace ddp::status {

MetricHistory::MetricHistory(std::size_t capacity, std::size_t max_keys)
    : capacity_(std::max<std::size_t>(capacity, 2)), max_keys_(max_keys) {}

void MetricHistory::add(const std::string& key, std::int64_t step, double unix, double value) {
  auto it = lines_.find(key);
  if (it == lines_.end()) {
    if (lines_.size() >= max_keys_) {
      ++dropped_keys_;
      return;
    }
    it = lines_.emplace(key, Line{}).first;
    it->second.points.reserve(capacity_);
  }
  Line& l = it->second;
  latest_[key] = value;
  l.newest = {step, unix, value};
  if (l.offered++ % l.stride != 0) return;
  if (l.points.size() == capacity_) {  // full: every second point goes, half as many kept
    std::size_t w = 0;
    for (std::size_t r = 0; r < l.points.size(); r += 2) l.points[w++] = l.points[r];
    l.points.resize(w);
    l.stride *= 2;
    l.offered = 1;  // this point is the first of the new stride
  }
  l.points.push_back(l.newest);
}

Series MetricHistory::series(std::size_t max_points) const {
  Series out;
  for (const auto& [key, l] : lines_) {
    std::vector<MetricPoint> pts = l.points;
    // The newest value, even when the stride skipped it: a curve ends where the run is.
    if (pts.empty() || pts.back().unix != l.newest.unix || pts.back().step != l.newest.step) {
      pts.push_back(l.newest);
    }
    out.emplace(key, pts.size() > max_points ? thin(pts, max_points) : std::move(pts));
  }
  return out;
}

std::size_t MetricHistory::points() const {
  std::size_t n = 0;
  for (const auto& [key, l] : lines_) n += l.points.size();
  return n;
}

std::size_t MetricHistory::bytes() const {
  std::size_t n = 0;
  for (const auto& [key, l] : lines_) {
    n += l.points.capacity() * sizeof(MetricPoint) + sizeof(Line) + 2 * key.capacity() +
         sizeof(double);
  }
  return n;
}

std::vector<MetricPoint> thin(const std::vector<MetricPoint>& points, std::size_t n) {
  if (points.size() <= n) return points;
  if (n == 0) return {};
  if (n == 1) return {points.back()};
  std::vector<MetricPoint> out;
  out.reserve(n);
  const double span = static_cast<double>(points.size() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(points[static_cast<std::size_t>(
        span * static_cast<double>(i) / static_cast<double>(n - 1) + 0.5)]);
  }
  return out;
}

namespace {

// The index of the last point at or before `unix` (points oldest first), or -1.
std::ptrdiff_t at_or_before(const std::vector<MetricPoint>& pts, double unix) {
  auto it = std::upper_bound(pts.begin(), pts.end(), unix,
                             [](double t, const MetricPoint& p) { return t < p.unix; });
  return (it - pts.begin()) - 1;
}

}  // namespace

Series combine(const std::vector<const Series*>& sources, std::size_t n) {
  Series out;
  std::map<std::string, std::vector<const std::vector<MetricPoint>*>> by_key;
  for (const Series* s : sources) {
    if (s == nullptr) continue;
    for (const auto& [key, pts] : *s) {
      if (!pts.empty()) by_key[key].push_back(&pts);
    }
  }
  for (const auto& [key, lines] : by_key) {
    const auto* grid_src = *std::max_element(
        lines.begin(), lines.end(), [](auto* a, auto* b) { return a->size() < b->size(); });
    const std::vector<MetricPoint> grid = thin(*grid_src, n);
    const bool sum = is_throughput_metric(key);
    std::vector<MetricPoint>& dst = out[key];
    dst.reserve(grid.size());
    for (const MetricPoint& g : grid) {
      double total = 0;
      int count = 0;
      for (const auto* pts : lines) {
        const std::ptrdiff_t i = at_or_before(*pts, g.unix);
        if (i < 0) continue;
        total += (*pts)[static_cast<std::size_t>(i)].value;
        ++count;
      }
      if (count == 0) continue;
      dst.push_back({g.step, g.unix, sum ? total : total / count});
    }
  }
  return out;
}

}  // namespace ddp::status
