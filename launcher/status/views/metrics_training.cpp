// The training's own numbers in the Prometheus exposition (issue 36; docs/metrics.md): the job
// as a whole (its step, throughput, ETA, time lost to restarts, goodput, its metrics combined)
// and each worker's metrics as it reported them (loss=, lr=, ... on its progress line), one
// series per metric name in the label `metric`.
#include <functional>

#include "metrics_family.hpp"

namespace ddp::status::detail {

void render_training(std::string& out, const std::vector<JobView>& jobs) {
  auto per_job = [&](std::string_view name, std::string_view type, std::string_view help,
                     const std::function<void(Family&, const JobStatus&, const std::string&)>& f) {
    Family fam(out, name, type, help);
    for (const auto& j : jobs) f(fam, *j.j, j.labels);
  };
  per_job("ddprun_job_step", "gauge", "The step of the job's slowest live rank.",
          [](Family& f, const JobStatus& j, const std::string& l) {
            if (j.step >= 0) f.sample(l, j.step);
          });
  per_job("ddprun_job_total_steps", "gauge", "The steps the job's workers said they will run.",
          [](Family& f, const JobStatus& j, const std::string& l) {
            if (j.total_steps >= 0) f.sample(l, j.total_steps);
          });
  per_job("ddprun_job_samples_per_second", "gauge", "Samples per second of all live ranks.",
          [](Family& f, const JobStatus& j, const std::string& l) {
            if (j.samples_per_s > 0) f.sample(l, j.samples_per_s);
          });
  per_job("ddprun_job_eta_seconds", "gauge",
          "Time to the last step at the median step time of the live ranks.",
          [](Family& f, const JobStatus& j, const std::string& l) {
            if (j.eta_s >= 0) f.sample(l, j.eta_s);
          });
  per_job("ddprun_job_restart_lost_seconds", "gauge",
          "Wall time the job lost to restarts so far (restarts, rendezvous after the first, "
          "in-place heals).",
          [](Family& f, const JobStatus& j, const std::string& l) { f.sample(l, j.lost_s); });
  per_job("ddprun_job_goodput_ratio", "gauge",
          "The share of the job's wall time not lost to restarts.",
          [](Family& f, const JobStatus& j, const std::string& l) { f.sample(l, j.goodput); });
  per_job("ddprun_job_metric", "gauge",
          "A metric the workers report, over the running (and succeeded) ranks: summed for *_per_s "
          "(throughput), averaged otherwise; its name in the label metric.",
          [](Family& f, const JobStatus& j, const std::string& l) {
            for (const auto& [key, value] : j.metrics) f.sample(l, value, "metric", key);
          });
  {
    Family f(out, "ddprun_rank_metric", "gauge",
             "A metric the worker reported on its progress line (loss=, lr=, ...), its latest "
             "value; its name in the label metric.");
    for (const auto& j : jobs) {
      for (const auto& n : j.nodes) {
        for (const auto& r : n.ranks) {
          for (const auto& [key, value] : r.r->metrics) f.sample(r.labels, value, "metric", key);
        }
      }
    }
  }
  Family f(out, "ddprun_rank_bad_metrics_total", "counter",
           "Metric values on the worker's progress lines that were dropped: not a number, a bad "
           "name, or past the 16 names kept per rank.");
  for (const auto& j : jobs) {
    for (const auto& n : j.nodes) {
      for (const auto& r : n.ranks) {
        if (r.r->bad_metrics > 0) f.sample(r.labels, r.r->bad_metrics);
      }
    }
  }
}

}  // namespace ddp::status::detail
