// The table of `ddprun status` (status_cli.hpp): one row per rank grouped by node, aligned,
// with human units; pure (a JobStatus in, text out).
#include "ddp/launch/status_cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/status/job_view.hpp"

namespace ddp::launch {

namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// 3 significant-ish digits: "7.5", "42", "512".
std::string short_number(double v) { return fixed(v, v < 10 ? 1 : 0); }

constexpr const char* kByteUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};

// The largest unit that leaves `b` at least 1 (its index, and its size in bytes).
std::pair<std::size_t, double> byte_unit(std::uint64_t b) {
  std::size_t u = 0;
  double scale = 1;
  while (static_cast<double>(b) / scale >= 1024 && u + 1 < std::size(kByteUnits)) {
    scale *= 1024;
    ++u;
  }
  return {u, scale};
}

std::string human_bytes(std::uint64_t b) {
  const auto [u, scale] = byte_unit(b);
  return (u == 0 ? std::to_string(b) : short_number(static_cast<double>(b) / scale)) + " " +
         kByteUnits[u];
}

// "3.1/80 GiB": both in the unit of the total.
std::string bytes_pair(std::uint64_t used, std::uint64_t total) {
  const auto [u, scale] = byte_unit(total);
  return short_number(static_cast<double>(used) / scale) + "/" +
         short_number(static_cast<double>(total) / scale) + " " + kByteUnits[u];
}

std::string human_duration(double s) {
  if (!(s > 0)) return "-";
  if (s < 1e-3) return fixed(s * 1e6, s < 1e-5 ? 1 : 0) + " us";
  if (s < 1) return fixed(s * 1e3, s < 0.01 ? 1 : 0) + " ms";
  if (s < 60) return fixed(s, 2) + " s";
  const auto whole = static_cast<long long>(s);
  char buf[64];
  if (whole < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", whole / 60, whole % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", whole / 3600, whole % 3600 / 60);
  }
  return buf;
}

std::string human_rate(double v) {
  if (!(v > 0)) return "-";
  if (v < 1000) return fixed(v, v < 100 ? 1 : 0);
  if (v < 1e6) return fixed(v / 1e3, 1) + "k";
  return fixed(v / 1e6, 1) + "M";
}

std::string percent(double frac) { return fixed(frac * 100, 0) + "%"; }

// Control characters (a newline in an error) become spaces.
std::string one_line(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

bool utf8_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Characters as a terminal counts them (UTF-8 lead bytes; good enough for hosts and errors).
std::size_t display_width(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += utf8_continuation(c) ? 0 : 1;
  return n;
}

constexpr std::size_t kMaxError = 60;

std::string truncated(const std::string& text, std::size_t max) {
  std::string s = one_line(text);
  if (display_width(s) <= max) return s;
  std::size_t keep = 0;
  for (std::size_t chars = 0; keep < s.size(); ++keep) {
    if (!utf8_continuation(s[keep]) && ++chars > max - 3) break;
  }
  return s.substr(0, keep) + "...";
}

// "loss=2.31 lr=0.001" (sep "="), at most kMaxMetricsCell characters.
constexpr std::size_t kMaxMetricsCell = 48;
std::string metrics_cell(const std::map<std::string, double>& metrics, const char* sep) {
  std::string s;
  for (const auto& [key, value] : metrics) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", value);
    s += (s.empty() ? "" : " ") + key + sep + buf;
  }
  return truncated(s, kMaxMetricsCell);
}

bool alive(const std::string& state) {
  return state == "starting" || state == "running" || state == "hung";
}

std::string gpu_cell(const status::RankStatus& r) {
  if (r.gpu < 0) return "-";
  std::string s = std::to_string(r.gpu);
  if (r.gpu_util) s += " " + percent(*r.gpu_util);
  if (r.gpu_mem_used) {
    s += " " + (r.gpu_mem_total ? bytes_pair(*r.gpu_mem_used, *r.gpu_mem_total)
                                : human_bytes(*r.gpu_mem_used));
  }
  return s;
}

std::string step_cell(const status::RankStatus& r) {
  if (r.step < 0) return "-";
  return std::to_string(r.step) + (r.total_steps > 0 ? "/" + std::to_string(r.total_steps) : "");
}

// "host #slot", and what is unusual about the node: lost, or its agent not running.
std::string node_cell(const status::NodeStatus& n, double now_unix) {
  std::string s = one_line(n.host.empty() ? "?" : n.host) + " #" + std::to_string(n.slot);
  if (n.lost) return s + " LOST (silent " + human_duration(now_unix - n.updated_unix) + ")";
  if (n.state != "running") s += " (" + one_line(n.state) + ")";
  return s;
}

struct Column {
  const char* title;
  bool right;  // numbers are right-aligned
};

constexpr Column kColumns[] = {{"NODE", false},      {"RANK", true},      {"LOCAL", true},
                               {"STATE", false},     {"RESTARTS", true},  {"STEP", true},
                               {"STEP TIME", true},  {"SAMPLES/S", true}, {"CPU", true},
                               {"RSS", true},        {"GPU", false},      {"METRICS", false},
                               {"LAST ERROR", false}};
constexpr std::size_t kNumColumns = std::size(kColumns);
using Row = std::array<std::string, kNumColumns>;

Row rank_row(const status::RankStatus& r) {
  const bool live = alive(r.state);
  return {"",
          std::to_string(r.rank),
          std::to_string(r.local_rank),
          one_line(r.state),
          std::to_string(r.restarts),
          step_cell(r),
          human_duration(r.step_time_s),
          human_rate(r.samples_per_s),
          live ? percent(r.cpu_frac) : "-",
          live && r.rss_bytes > 0 ? human_bytes(r.rss_bytes) : "-",
          gpu_cell(r),
          metrics_cell(r.metrics, "="),
          r.last_error.empty() ? "" : truncated(r.last_error, kMaxError)};
}

// "step 120/1000  3.5k samples/s  ETA 3m49s  goodput 99.2% (lost 1.20 s)  loss 2.31": the job
// as a whole (record.hpp's summary), or "" before any rank reported a step.
std::string job_line(const status::JobStatus& job) {
  if (job.step < 0) return "";
  std::string s = "job  step " + std::to_string(job.step);
  if (job.total_steps > 0) s += "/" + std::to_string(job.total_steps);
  if (job.samples_per_s > 0) s += "  " + human_rate(job.samples_per_s) + " samples/s";
  if (job.eta_s > 0) s += "  ETA " + human_duration(job.eta_s);
  if (job.wall_s > 0) {
    s += "  goodput " + fixed(job.goodput * 100, 1) + "%";
    if (job.lost_s > 0) s += " (lost " + human_duration(job.lost_s) + " to restarts)";
  }
  const std::string m = metrics_cell(job.metrics, " ");
  return s + (m.empty() ? "" : "  " + m) + "\n";
}

std::string header_line(const status::JobStatus& job) {
  int lost = 0;
  int max_restarts = 0;
  for (const auto& n : job.nodes) {
    lost += n.lost ? 1 : 0;
    max_restarts = std::max(max_restarts, n.max_restarts);
  }
  std::string s = "run " + one_line(job.run_id) + "  state " + one_line(job.state) + "  round " +
                  (job.round < 0 ? std::string("-") : std::to_string(job.round)) + "  nodes " +
                  std::to_string(job.members);
  if (lost > 0) s += " (" + std::to_string(lost) + " lost)";
  s += "  ranks " + std::to_string(job.ranks) + "  restarts " + std::to_string(job.restarts) + "/" +
       std::to_string(max_restarts);
  return s + "\n";
}

}  // namespace

std::string format_status_table(const status::JobStatus& job) {
  std::vector<Row> rows;
  Row title;
  for (std::size_t c = 0; c < kNumColumns; ++c) title[c] = kColumns[c].title;
  rows.push_back(title);
  // The current round's nodes by group rank (so global ranks ascend), then the others by slot.
  std::vector<const status::NodeStatus*> nodes;
  for (const auto& n : job.nodes) nodes.push_back(&n);
  auto order = [&](const status::NodeStatus* n) {
    const bool current = !n->lost && n->round == job.round;
    return std::make_tuple(current ? 0 : 1, current ? n->group_rank : 0, n->slot);
  };
  std::stable_sort(nodes.begin(), nodes.end(),
                   [&](const auto* a, const auto* b) { return order(a) < order(b); });
  for (const auto* np : nodes) {
    const status::NodeStatus& n = *np;
    auto ranks = n.ranks;
    std::sort(ranks.begin(), ranks.end(),
              [](const auto& a, const auto& b) { return a.local_rank < b.local_rank; });
    const std::size_t first = rows.size();
    for (const auto& r : ranks) rows.push_back(rank_row(r));
    if (ranks.empty()) {  // between rounds, or not spawned yet: the node alone
      Row r;
      r.fill("-");
      r[3] = n.lost ? "lost" : one_line(n.state);
      r[kNumColumns - 2] = "";
      r[kNumColumns - 1] = n.restarts.empty() ? "" : truncated(n.restarts.back().what, kMaxError);
      rows.push_back(r);
    }
    rows[first][0] = node_cell(n, job.now_unix);
  }
  std::array<std::size_t, kNumColumns> width{};
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < kNumColumns; ++c) {
      width[c] = std::max(width[c], display_width(r[c]));
    }
  }
  std::string out = header_line(job) + job_line(job);
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < kNumColumns; ++c) {
      const std::string pad(width[c] - display_width(r[c]), ' ');
      if (c > 0) line += "  ";
      line += kColumns[c].right ? pad + r[c] : r[c] + (c + 1 < kNumColumns ? pad : "");
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (job.nodes.empty()) out += "(no node has published its status yet)\n";
  return out;
}

}  // namespace ddp::launch
