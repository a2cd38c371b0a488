// The verdicts of hang_policy.hpp: --on-hang's values, the node summary's JSON codec (short
// field names, every field checked on the way in) and judge(), which names the stalled ranks
// and the stragglers from the nodes' summaries.
#include "ddp/launch/hang_policy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"

namespace ddp::launch {

OnHang parse_on_hang(const std::string& text) {
  if (text == "report") return OnHang::report;
  if (text == "dump") return OnHang::dump;
  if (text == "restart") return OnHang::restart;
  if (text == "stop") return OnHang::stop;
  throw ConfigError("--on-hang: '" + text + "' is not report, dump, restart or stop");
}

const char* to_string(OnHang a) {
  switch (a) {
    case OnHang::report: return "report";
    case OnHang::dump: return "dump";
    case OnHang::restart: return "restart";
    case OnHang::stop: return "stop";
  }
  return "?";
}

// The summary on the wire, one object per node:
//   {"g": group_rank, "h": host, "q": seq, "r": [rank, ...]}
// and per rank
//   {"r": rank, "l": local_rank, "p": pid, "s": step, "ph": phase (absent when empty),
//    "rp": reports, "i": idle_s, "c": cpu_frac, "st": state (one character),
//    "m": median_step_s, "n": steps_known}
// Doubles are written in their shortest exact form, so a summary decodes to what was encoded.
// Unknown fields are ignored (a newer agent may add some).
std::string encode_summary(const NodeSummary& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : s.ranks) {
    nlohmann::json j = {{"r", r.rank},          {"l", r.local_rank},
                        {"p", r.pid},           {"s", r.step},
                        {"rp", r.reports},      {"i", r.idle_s},
                        {"c", r.cpu_frac},      {"st", std::string(1, r.state)},
                        {"m", r.median_step_s}, {"n", r.steps_known}};
    if (!r.phase.empty()) j["ph"] = r.phase;
    ranks.push_back(std::move(j));
  }
  nlohmann::json j = {{"g", s.group_rank}, {"h", s.host}, {"q", s.seq}, {"r", std::move(ranks)}};
  // A host name or phase that is not UTF-8 is replaced, not refused: it is only for reports.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw ProtocolError("health summary: field '" + field + "' " + what);
}

const nlohmann::json& need(const nlohmann::json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) bad(path + key, "is missing");
  return *it;
}

std::int64_t int_field(const nlohmann::json& obj, const char* key, const std::string& path,
                       std::int64_t lo, std::int64_t hi) {
  const auto& v = need(obj, key, path);
  std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v.is_number_integer()) bad(path + key, "must be " + range);
  if (v.is_number_unsigned()) {
    auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi)) bad(path + key, "must be " + range);
    return static_cast<std::int64_t>(u);
  }
  auto i = v.get<std::int64_t>();
  if (i < lo || i > hi) bad(path + key, "must be " + range);
  return i;
}

int small_int(const nlohmann::json& obj, const char* key, const std::string& path,
              std::int64_t lo) {
  return static_cast<int>(int_field(obj, key, path, lo, std::numeric_limits<int>::max()));
}

double seconds_field(const nlohmann::json& obj, const char* key, const std::string& path) {
  const auto& v = need(obj, key, path);
  if (!v.is_number()) bad(path + key, "must be a number >= 0");
  auto d = v.get<double>();
  if (!std::isfinite(d) || d < 0) bad(path + key, "must be a number >= 0");
  return d;
}

std::string string_field(const nlohmann::json& obj, const char* key, const std::string& path) {
  const auto& v = need(obj, key, path);
  if (!v.is_string()) bad(path + key, "must be a string");
  return v.get<std::string>();
}

RankHealth decode_rank(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) bad(path.substr(0, path.size() - 1), "must be an object");
  RankHealth r;
  r.rank = small_int(j, "r", path, 0);
  r.local_rank = small_int(j, "l", path, 0);
  r.pid = static_cast<pid_t>(small_int(j, "p", path, 0));
  r.step = int_field(j, "s", path, -1, std::numeric_limits<std::int64_t>::max());
  if (j.contains("ph")) r.phase = string_field(j, "ph", path);
  const auto& rp = need(j, "rp", path);
  if (!rp.is_boolean()) bad(path + "rp", "must be true or false");
  r.reports = rp.get<bool>();
  r.idle_s = seconds_field(j, "i", path);
  r.cpu_frac = seconds_field(j, "c", path);
  auto st = string_field(j, "st", path);
  if (st.size() != 1) bad(path + "st", "must be one character");
  r.state = st[0];
  r.median_step_s = seconds_field(j, "m", path);
  r.steps_known = small_int(j, "n", path, 0);
  return r;
}

}  // namespace

NodeSummary decode_summary(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded())
    throw ProtocolError("health summary: not JSON (" + text.substr(0, 80) + ")");
  if (!j.is_object()) throw ProtocolError("health summary: not a JSON object");
  NodeSummary s;
  s.group_rank = small_int(j, "g", "", 0);
  s.host = string_field(j, "h", "");
  s.seq = static_cast<std::uint64_t>(
      int_field(j, "q", "", 0, std::numeric_limits<std::int64_t>::max()));
  const auto& ranks = need(j, "r", "");
  if (!ranks.is_array()) bad("r", "must be an array");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    s.ranks.push_back(decode_rank(ranks[i], "r[" + std::to_string(i) + "]."));
  }
  return s;
}

double rank_idle_s(bool reports, double since_progress_s, double since_cpu_moved_s) {
  return std::max(0.0, reports ? since_progress_s : since_cpu_moved_s);
}

namespace {

// The median of `v` (not empty); with an even count the lower of the two middle values. The
// baseline is then a step time that at least half the ranks reach: in a 2-rank job the slower
// rank is compared against the other one (the mean of the two would hide a 3x straggler behind
// a factor of 2), and a job of fast and slow halves names its slow half.
double lower_median(std::vector<double> v) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

void judge_stragglers(const std::vector<NodeSummary>& nodes, const HangSettings& s,
                      StragglerState& st, std::vector<int>& named, double& baseline) {
  std::map<int, double> comparable;  // rank -> median step time
  std::set<int> seen;
  for (const auto& n : nodes) {
    for (const auto& r : n.ranks) {
      seen.insert(r.rank);
      if (r.steps_known >= s.straggler_min_steps && r.median_step_s > 0) {
        comparable[r.rank] = r.median_step_s;
      }
    }
  }
  // A rank that was not found above the factor this check (not comparable, or fast) starts its
  // count again: the checks above must be consecutive.
  if (comparable.size() < 2) {
    for (int rank : seen) st.above[rank] = 0;
    return;
  }
  std::vector<double> medians;
  for (const auto& [rank, m] : comparable) medians.push_back(m);
  const double job = lower_median(std::move(medians));
  baseline = job;
  int checks = std::max(1, s.straggler_checks);
  for (int rank : seen) {
    auto it = comparable.find(rank);
    if (it == comparable.end() || !(it->second > s.straggler_factor * job)) {
      st.above[rank] = 0;
      continue;
    }
    if (++st.above[rank] >= checks && !st.named[rank]) {
      st.named[rank] = true;
      named.push_back(rank);
    }
  }
}

}  // namespace

JobVerdict judge(const std::vector<NodeSummary>& nodes, const HangSettings& s, StragglerState& st) {
  JobVerdict v;
  if (s.timeout_s > 0) {
    std::set<int> stalled;
    for (const auto& n : nodes) {
      for (const auto& r : n.ranks) {
        if (r.idle_s >= s.timeout_s) stalled.insert(r.rank);
      }
    }
    v.stalled.assign(stalled.begin(), stalled.end());
  }
  if (s.straggler_factor > 0) {
    judge_stragglers(nodes, s, st, v.stragglers, v.straggler_baseline_s);
  }
  return v;
}

}  // namespace ddp::launch
