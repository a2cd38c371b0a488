// The Chrome trace of a job (trace.hpp): each node's part encoded for the store, decoded with
// bounds, and all parts merged into one Trace Event Format document on the wall clock.
#include "ddp/launch/trace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"

namespace ddp::launch {

using nlohmann::json;

namespace {

constexpr std::int64_t kMaxUs = std::int64_t{100} * 365 * 24 * 3600 * 1000000;  // a century
constexpr std::size_t kMaxText = 4096;  // a host, a phase's name or detail

std::int64_t to_us(double t, double t0) {
  const double us = std::round((t - t0) * 1e6);
  if (!(us > 0)) return 0;
  return us > static_cast<double>(kMaxUs) ? kMaxUs : static_cast<std::int64_t>(us);
}

// The earliest and latest time of a node (inf/-inf when it has none).
void bounds(const NodeTrace& t, double& lo, double& hi) {
  for (const auto& p : t.phases) {
    lo = std::min(lo, p.start_unix);
    hi = std::max(hi, std::max(p.start_unix, p.end_unix));
  }
  for (const auto& [lr, r] : t.ranks) {
    for (const auto& s : r.steps) {
      lo = std::min(lo, s.start_unix);
      hi = std::max(hi, std::max(s.start_unix, s.end_unix));
    }
  }
}

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  DDP_THROW(ProtocolError, "bad node trace: " + field + " " + why);
}

const json& need(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end()) bad(key, "is missing");
  return *it;
}

std::int64_t integer(const json& v, const std::string& field, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer()) bad(field, "is not an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) {
    bad(field, "is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  const auto n = v.get<std::int64_t>();
  if (n < lo || n > hi) {
    bad(field, "is " + std::to_string(n) + ", out of range [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
  }
  return n;
}

std::string text(const json& v, const std::string& field) {
  if (!v.is_string()) bad(field, "is not a string");
  auto s = v.get<std::string>();
  if (s.size() > kMaxText) bad(field, "is longer than " + std::to_string(kMaxText) + " bytes");
  return s;
}

const json& array(const json& v, const std::string& field, std::size_t max) {
  if (!v.is_array()) bad(field, "is not an array");
  if (v.size() > max) {
    bad(field, "has " + std::to_string(v.size()) + " entries, more than " + std::to_string(max));
  }
  return v;
}

const json& tuple(const json& v, const std::string& field, std::size_t n) {
  if (!v.is_array() || v.size() != n) bad(field, "is not an array of " + std::to_string(n));
  return v;
}

}  // namespace

std::string encode_node_trace(const NodeTrace& t) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  bounds(t, lo, hi);
  const double t0 = std::isfinite(lo) ? lo : 0;
  json phases = json::array();
  const std::size_t p0 = t.phases.size() > kTraceMaxPhases ? t.phases.size() - kTraceMaxPhases : 0;
  for (std::size_t i = p0; i < t.phases.size(); ++i) {
    const auto& p = t.phases[i];
    const std::int64_t end = p.end_unix == 0 ? -1 : to_us(p.end_unix, t0);
    phases.push_back(
        {p.name.substr(0, kMaxText), to_us(p.start_unix, t0), end, p.detail.substr(0, kMaxText)});
  }
  json ranks = json::array();
  for (const auto& [lr, r] : t.ranks) {
    if (ranks.size() >= kTraceMaxRanks) break;
    json steps = json::array();
    const std::size_t s0 = r.steps.size() > kTraceSteps ? r.steps.size() - kTraceSteps : 0;
    for (std::size_t i = s0; i < r.steps.size(); ++i) {
      const auto& s = r.steps[i];
      const std::int64_t start = to_us(s.start_unix, t0);
      steps.push_back({std::max<std::int64_t>(0, s.step), start,
                       std::max<std::int64_t>(0, to_us(s.end_unix, t0) - start)});
    }
    ranks.push_back({lr, r.rank, std::move(steps)});
  }
  json j = {{"v", 1},
            {"slot", t.slot},
            {"host", t.host.substr(0, kMaxText)},
            {"group_rank", t.group_rank},
            {"t0", t0},
            {"phases", std::move(phases)},
            {"ranks", std::move(ranks)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

NodeTrace decode_node_trace(const std::string& input) {
  if (input.size() > kTraceMaxBytes) {
    bad("text", "is " + std::to_string(input.size()) + " bytes, more than " +
                    std::to_string(kTraceMaxBytes));
  }
  const json j = json::parse(input, nullptr, false);
  if (j.is_discarded()) bad("text", "is not JSON");
  if (!j.is_object()) bad("text", "is not a JSON object");
  const auto v = integer(need(j, "v"), "v", 0, 1 << 30);
  if (v != 1) bad("v", "is " + std::to_string(v) + "; this ddprun reads version 1");
  NodeTrace t;
  t.slot = static_cast<int>(integer(need(j, "slot"), "slot", 0, 1 << 24));
  t.host = text(need(j, "host"), "host");
  t.group_rank = static_cast<int>(integer(need(j, "group_rank"), "group_rank", -1, 1 << 24));
  const json& jt0 = need(j, "t0");
  if (!jt0.is_number() || !std::isfinite(jt0.get<double>()) || jt0.get<double>() < 0) {
    bad("t0", "is not a time (unix seconds >= 0)");
  }
  const double t0 = jt0.get<double>();
  const auto at = [t0](std::int64_t us) { return t0 + static_cast<double>(us) / 1e6; };
  const json& phases = array(need(j, "phases"), "phases", kTraceMaxPhases);
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const std::string f = "phases[" + std::to_string(i) + "]";
    const json& p = tuple(phases[i], f, 4);
    status::Phase ph;
    ph.name = text(p[0], f + ".name");
    ph.start_unix = at(integer(p[1], f + ".start", 0, kMaxUs));
    const auto end = integer(p[2], f + ".end", -1, kMaxUs);
    ph.end_unix = end < 0 ? 0 : at(end);
    ph.detail = text(p[3], f + ".detail");
    t.phases.push_back(std::move(ph));
  }
  const json& ranks = array(need(j, "ranks"), "ranks", kTraceMaxRanks);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string f = "ranks[" + std::to_string(i) + "]";
    const json& r = tuple(ranks[i], f, 3);
    const auto lr = static_cast<int>(integer(r[0], f + ".local_rank", 0, 1 << 24));
    if (t.ranks.count(lr) != 0) bad(f + ".local_rank", "repeats " + std::to_string(lr));
    RankSteps& rs = t.ranks[lr];
    rs.rank = static_cast<int>(integer(r[1], f + ".rank", -1, 1 << 30));
    const json& steps = array(r[2], f + ".steps", kTraceSteps);
    rs.steps.reserve(steps.size());
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const std::string g = f + ".steps[" + std::to_string(k) + "]";
      const json& s = tuple(steps[k], g, 3);
      StepSpan span;
      span.step = integer(s[0], g + ".step", 0, std::numeric_limits<std::int64_t>::max());
      const auto start = integer(s[1], g + ".start", 0, kMaxUs);
      const auto dur = integer(s[2], g + ".dur", 0, kMaxUs);
      span.start_unix = at(start);
      span.end_unix = at(start + dur);
      rs.steps.push_back(span);
    }
  }
  return t;
}

namespace {

struct Event {
  std::int64_t ts = 0;
  bool meta = false;
  int pid = 0;
  int tid = 0;
  json body;
};

json meta(const char* name, int pid, int tid, json args) {
  return {{"name", name}, {"ph", "M"}, {"pid", pid},
          {"tid", tid},   {"ts", 0},   {"args", std::move(args)}};
}

}  // namespace

std::string chrome_trace(const std::vector<NodeTrace>& nodes) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& n : nodes) bounds(n, lo, hi);
  const double t0 = std::isfinite(lo) ? lo : 0;
  const double last = std::isfinite(hi) ? hi : t0;
  std::vector<Event> events;
  const auto complete = [&](const std::string& name, const char* cat, int pid, int tid,
                            double start, double end, json args) {
    const std::int64_t ts = to_us(start, t0);
    const std::int64_t dur = std::max<std::int64_t>(0, to_us(end, t0) - ts);
    events.push_back({ts, false, pid, tid,
                      json{{"name", name},
                           {"cat", cat},
                           {"ph", "X"},
                           {"pid", pid},
                           {"tid", tid},
                           {"ts", ts},
                           {"dur", dur},
                           {"args", std::move(args)}}});
  };
  for (const auto& n : nodes) {
    const int pid = n.slot + 1;
    const std::string pname = "node " + n.host + " (slot " + std::to_string(n.slot) +
                              ", group rank " + std::to_string(n.group_rank) + ")";
    events.push_back({0, true, pid, 0, meta("process_name", pid, 0, {{"name", pname}})});
    events.push_back({0, true, pid, 0, meta("process_sort_index", pid, 0, {{"sort_index", pid}})});
    events.push_back({0, true, pid, 0, meta("thread_name", pid, 0, {{"name", "launcher"}})});
    events.push_back({0, true, pid, 0, meta("thread_sort_index", pid, 0, {{"sort_index", 0}})});
    for (const auto& [lr, r] : n.ranks) {
      const int tid = lr + 1;
      const std::string tname =
          "rank " + std::to_string(r.rank) + " (local " + std::to_string(lr) + ")";
      events.push_back({0, true, pid, tid, meta("thread_name", pid, tid, {{"name", tname}})});
      events.push_back(
          {0, true, pid, tid, meta("thread_sort_index", pid, tid, {{"sort_index", tid}})});
    }
    for (const auto& p : n.phases) {
      const double end = p.end_unix == 0 ? std::max(last, p.start_unix) : p.end_unix;
      json args = {{"detail", p.detail}};
      if (p.end_unix == 0) args["open"] = true;
      complete(p.name, "launcher", pid, 0, p.start_unix, end, std::move(args));
    }
    for (const auto& [lr, r] : n.ranks) {
      for (const auto& s : r.steps) {
        complete("step " + std::to_string(s.step), "step", pid, lr + 1, s.start_unix, s.end_unix,
                 {{"step", s.step}, {"rank", r.rank}});
      }
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.meta != b.meta) return a.meta;
    if (a.ts != b.ts) return a.ts < b.ts;
    if (a.pid != b.pid) return a.pid < b.pid;
    return a.tid < b.tid;
  });
  json list = json::array();
  for (auto& e : events) list.push_back(std::move(e.body));
  json doc = {{"traceEvents", std::move(list)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"generator", "ddprun"},
                {"clock", "wall clock; ts 0 is t0_unix"},
                {"t0_unix", t0},
                {"nodes", nodes.size()}}}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace ddp::launch
