// The job as a whole, from its nodes' records (record.hpp's JobStatus summary fields): what the
// top of the live page and `ddprun status` show. Pure.
#include <algorithm>
#include <vector>

#include "ddp/status/record.hpp"

namespace ddp::status {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// Time this node lost to restarts: every restart phase, every rendezvous and spawn after the
// first of each (the first are the job's start, not a loss), and its in-place heals.
double node_lost_s(const NodeStatus& n, double now) {
  double lost = n.heal_s;
  int rendezvous = 0, spawns = 0;
  for (const Phase& p : n.phases) {
    const double end = p.end_unix > 0 ? p.end_unix : now;
    const double len = std::max(0.0, end - p.start_unix);
    if (p.name == "restart") lost += len;
    if (p.name == "rendezvous" && rendezvous++ > 0) lost += len;
    if (p.name == "spawn" && spawns++ > 0) lost += len;
  }
  return lost;
}

}  // namespace

void fill_summary(JobStatus& job) {
  job.step = -1;
  job.total_steps = -1;
  job.samples_per_s = 0;
  job.metrics.clear();
  job.eta_s = -1;
  job.wall_s = 0;
  job.lost_s = 0;
  double first = 0;
  std::map<std::string, std::pair<double, int>> sums;  // metric: (sum, ranks)
  std::vector<double> step_times;
  for (const NodeStatus& n : job.nodes) {
    if (n.started_unix > 0 && (first == 0 || n.started_unix < first)) first = n.started_unix;
    job.lost_s = std::max(job.lost_s, node_lost_s(n, job.now_unix));
    if (n.lost || n.round != job.round) continue;
    for (const RankStatus& r : n.ranks) {
      if (r.state != "running" && r.state != "succeeded") continue;
      if (r.step >= 0) job.step = job.step < 0 ? r.step : std::min(job.step, r.step);
      job.total_steps = std::max(job.total_steps, r.total_steps);
      // A finished job keeps its last metrics; its throughput and ETA are over.
      for (const auto& [key, value] : r.metrics) {
        auto& [sum, count] = sums[key];
        sum += value;
        ++count;
      }
      if (r.state != "running") continue;
      job.samples_per_s += r.samples_per_s;
      if (r.step_time_s > 0) step_times.push_back(r.step_time_s);
    }
  }
  for (const auto& [key, sc] : sums) {
    job.metrics[key] = is_throughput_metric(key) ? sc.first : sc.first / sc.second;
  }
  const double step_time = median(step_times);
  if (job.step >= 0 && job.total_steps > job.step && step_time > 0) {
    job.eta_s = static_cast<double>(job.total_steps - job.step) * step_time;
  } else if (job.step >= 0 && job.total_steps > 0 && job.step >= job.total_steps) {
    job.eta_s = 0;
  }
  job.wall_s = first > 0 ? std::max(0.0, job.now_unix - first) : 0;
  job.lost_s = std::min(job.lost_s, job.wall_s);
  job.goodput = job.wall_s > 0 ? 1 - job.lost_s / job.wall_s : 1;
}

}  // namespace ddp::status
