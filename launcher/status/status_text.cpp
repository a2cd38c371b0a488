// The progress line and the exit summary (status_text.hpp): pure formatting of status records.
#include "ddp/launch/status_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

namespace ddp::launch {

namespace {

constexpr std::size_t kMaxRows = 32;     // rank rows in the summary before it abridges
constexpr std::size_t kMaxRestarts = 8;  // restart events listed (the newest)

template <typename... A>
std::string fmt(const char* f, A... a) {
  char buf[256];
  const int n = std::snprintf(buf, sizeof buf, f, a...);
  return std::string(
      buf, n < 0 ? 0 : std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// A restart's cause in words ("exitcode" -> "non-zero exit"), never read as an exit code.
std::string cause_word(const std::string& cause) {
  if (cause == "exitcode") return "non-zero exit";
  if (cause == "signal") return "killed by a signal";
  if (cause == "oom") return "out of memory";
  if (cause == "node_lost") return "node lost";
  if (cause == "node_joined") return "node joined";
  return cause;
}

// "exitcode", 2 -> "2 non-zero exits": a count of failures of one kind.
std::string cause_in_words(const std::string& cause, int n) {
  const std::string k = std::to_string(n);
  const bool many = n != 1;
  if (cause == "exitcode") return k + (many ? " non-zero exits" : " non-zero exit");
  if (cause == "signal") return k + " killed by a signal";
  if (cause == "oom") return k + " out of memory";
  if (cause == "hang") return k + (many ? " hangs" : " hang");
  if (cause == "node_lost") return k + (many ? " nodes lost" : " node lost");
  if (cause == "node_joined") return k + (many ? " nodes joined" : " node joined");
  return k + " " + cause;
}

std::string seconds(double s) { return s < 10 ? fmt("%.3g s", s) : fmt("%.0f s", s); }

std::string rate(double r) { return r < 10 ? fmt("%.1f", r) : fmt("%.0f", r); }

std::string node_name(const status::NodeStatus& n) {
  return n.host + " (slot " + std::to_string(n.slot) + ")";
}

// Columns padded to their widest cell, two blanks apart; the last one unpadded.
std::string table(const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  std::vector<std::size_t> w;
  for (const auto& r : rows) {
    if (w.size() < r.size()) w.resize(r.size(), 0);
    for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line = indent;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string format_duration(double s) {
  if (!(s > 0)) return "0s";
  if (s > 1e9) s = 1e9;
  const auto t = static_cast<std::int64_t>(std::llround(s));
  if (t < 60) return std::to_string(t) + "s";
  if (t < 3600)
    return fmt("%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return fmt("%lldh%02lldm", static_cast<long long>(t / 3600),
             static_cast<long long>((t % 3600) / 60));
}

std::string format_progress_line(const status::NodeStatus& node) {
  std::int64_t step = -1, total = -1;
  double samples = 0;
  std::vector<double> times;
  bool any = false;
  for (const auto& r : node.ranks) {
    if (r.step < 0) continue;
    step = any ? std::min(step, r.step) : r.step;
    any = true;
    total = std::max(total, r.total_steps);
    if (r.samples_per_s > 0) samples += r.samples_per_s;
    if (r.step_time_s > 0) times.push_back(r.step_time_s);
  }
  if (!any) return "";
  std::string line = "ddprun: step " + std::to_string(step);
  if (node.store_away_s >= 0) line += " | store away " + seconds(node.store_away_s);
  if (total > 0) line += "/" + std::to_string(total);
  if (samples > 0) line += " | " + rate(samples) + " samples/s";
  const double st = median(times);
  if (st > 0) line += " | step " + seconds(st);
  if (st > 0 && total > 0) {
    line += " | ETA " +
            format_duration(static_cast<double>(std::max<std::int64_t>(0, total - step)) * st);
  }
  return line;
}

std::string format_exit_summary(const status::JobStatus& job, double wall_s, int exit_code) {
  std::string out = "ddprun: summary";
  if (!job.run_id.empty()) out += " of run " + job.run_id;
  out += "\n";
  std::vector<std::vector<std::string>> head;
  std::string wall = fmt("%.1f s", std::max(0.0, wall_s));
  if (wall_s >= 60) wall = format_duration(wall_s) + " (" + wall + ")";
  head.push_back({"wall time", wall});
  const std::string state = exit_code == 0 ? "succeeded" : "failed";
  std::string st = state + ", exit code " + std::to_string(exit_code);
  if (!job.state.empty() && job.state != state) st += " (job " + job.state + ")";
  head.push_back({"final state", st});
  std::size_t nranks = 0;
  int restarts = job.restarts;
  std::map<std::string, int> causes;
  for (const auto& n : job.nodes) {
    nranks += n.ranks.size();
    restarts = std::max(restarts, n.restart_count);
    for (const auto& [c, k] : n.failures_by_cause) causes[c] = std::max(causes[c], k);
  }
  head.push_back({"nodes", std::to_string(job.nodes.size()) + ", ranks " + std::to_string(nranks)});
  // Restart events: every node tells the same restart; keep one of each.
  std::set<std::tuple<int, std::string, std::string>> seen;
  std::vector<std::pair<const status::RestartEvent*, const status::NodeStatus*>> events;
  for (const auto& n : job.nodes) {
    for (const auto& e : n.restarts) {
      if (seen.insert({e.round, e.cause, e.what}).second) events.push_back({&e, &n});
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first->round, a.first->at_unix) < std::tie(b.first->round, b.first->at_unix);
  });
  if (causes.empty()) {
    for (const auto& [e, n] : events) ++causes[e->cause];
  }
  std::string r = std::to_string(restarts);
  std::string why;
  for (const auto& [c, k] : causes) {
    if (k > 0) why += (why.empty() ? "" : ", ") + cause_in_words(c, k);
  }
  if (!why.empty()) r += " (failures: " + why + ")";
  head.push_back({"restarts", r});
  int outages = 0;
  double outage_s = 0;
  for (const auto& n : job.nodes) {
    outages = std::max(outages, n.store_outages);
    outage_s = std::max(outage_s, n.store_outage_s);
  }
  int heals = 0;
  double heal_s = 0;
  std::string last_heal;
  for (const auto& n : job.nodes) {
    heals += n.heals;
    heal_s += n.heal_s;
    if (!n.last_heal.empty()) last_heal = n.last_heal;
  }
  if (heals > 0) {
    head.push_back({"healed", std::to_string(heals) + " in place, " + fmt("%.1f s", heal_s) +
                                  " in all (last: " + last_heal + ")"});
  }
  if (outages > 0) {
    head.push_back(
        {"store outages", std::to_string(outages) + ", " + fmt("%.1f s", outage_s) + " in all"});
  }
  out += table(head, "  ");
  const std::size_t skip = events.size() > kMaxRestarts ? events.size() - kMaxRestarts : 0;
  if (skip > 0) out += "    ... " + std::to_string(skip) + " earlier restart(s)\n";
  for (std::size_t i = skip; i < events.size(); ++i) {
    const auto& [e, n] = events[i];
    out += "    round " + std::to_string(e->round) + ": " + cause_word(e->cause) + ": " + e->what +
           " [node " + node_name(*n) + "]\n";
  }
  // Per rank: the last state and exit.
  struct Row {
    const status::RankStatus* r;
    const status::NodeStatus* n;
  };
  std::vector<Row> rows;
  for (const auto& n : job.nodes) {
    for (const auto& rk : n.ranks) rows.push_back({&rk, &n});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.r->rank, a.n->slot, a.r->local_rank) <
           std::tie(b.r->rank, b.n->slot, b.r->local_rank);
  });
  const auto shown_state = [](const Row& x) {
    const bool over =
        x.r->state == "succeeded" || x.r->state == "failed" || x.r->state == "stopped";
    return x.n->lost && !over ? std::string("lost") : x.r->state;
  };
  std::map<std::string, int> hidden;  // a big job: the ranks that succeeded are counted only
  if (rows.size() > kMaxRows) {
    std::vector<Row> keep;
    for (const auto& x : rows) {
      if (shown_state(x) != "succeeded" && keep.size() < kMaxRows) {
        keep.push_back(x);
      } else {
        ++hidden[shown_state(x)];
      }
    }
    rows = std::move(keep);
  }
  if (!rows.empty()) {
    std::vector<std::vector<std::string>> t = {
        {"rank", "node", "local", "state", "restarts", "step", "exit", "last error"}};
    for (const auto& x : rows) {
      t.push_back({std::to_string(x.r->rank), node_name(*x.n), std::to_string(x.r->local_rank),
                   shown_state(x), std::to_string(x.r->restarts),
                   x.r->step >= 0 ? std::to_string(x.r->step) : "-",
                   x.r->last_exit ? std::to_string(*x.r->last_exit) : "-",
                   x.r->last_error.empty() ? "-" : x.r->last_error});
    }
    out += table(t, "  ");
  }
  if (!hidden.empty()) {
    std::string more;
    for (const auto& [s, k] : hidden)
      more += (more.empty() ? "" : ", ") + s + " " + std::to_string(k);
    out += "  ... and more ranks: " + more + "\n";
  }
  // The slowest rank by its median step time.
  const status::RankStatus* slow = nullptr;
  const status::NodeStatus* slow_node = nullptr;
  std::vector<double> times;
  for (const auto& n : job.nodes) {
    for (const auto& rk : n.ranks) {
      if (rk.step_time_s <= 0) continue;
      times.push_back(rk.step_time_s);
      if (slow == nullptr || rk.step_time_s > slow->step_time_s) {
        slow = &rk;
        slow_node = &n;
      }
    }
  }
  if (slow != nullptr) {
    out += "  slowest rank: rank " + std::to_string(slow->rank) + " on " + node_name(*slow_node) +
           ", local " + std::to_string(slow->local_rank) + ": step " + seconds(slow->step_time_s) +
           " (median of all ranks " + seconds(median(times)) + ")\n";
  }
  return out;
}

}  // namespace ddp::launch
