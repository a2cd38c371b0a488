// The hang and straggler reports (see hang_report.hpp): a console block in the layout of
// torchrun's failure summary (rules of '=' around, '-' under the title), the suspect group's
// ranks and full stack first, the other groups in one line each, what could not be taken, the
// action; the same as JSON; one paragraph for the error file.
#include "ddp/launch/hang_report.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddp::launch {
namespace {

using nlohmann::json;

constexpr std::size_t kRuleMax = 60;           // torchrun's summary is at most 60 wide
constexpr std::size_t kSuspectFrames = 40;     // frames of the suspect's stack on the console
constexpr std::size_t kSuspectRanksShown = 8;  // ranks of the suspect group, one line each
constexpr std::size_t kOtherFrames = 3;        // innermost frames of each other group

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Seconds as a person reads them: "62", "0.31", "4.2 ms".
std::string seconds(double s) {
  if (s >= 10) return fixed(s, 0) + " s";
  if (s >= 0.01) return fixed(s, 2) + " s";
  return fixed(s * 1000, 1) + " ms";
}

// {0, 2, 3, 4, 7} -> "0,2-4,7"
std::string rank_set(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// "train_step (g.py:11)"; a C++ name past 120 bytes (pybind11's templates) is cut.
std::string frame_text(const Frame& f) {
  std::string fn = f.function;
  if (fn.size() > 120) {
    std::size_t n = 117;
    while (n > 0 && (static_cast<unsigned char>(fn[n]) & 0xC0) == 0x80) --n;
    fn = fn.substr(0, n) + "...";
  }
  if (f.file.empty()) return fn;
  return fn + " (" + f.file + (f.line > 0 ? ":" + std::to_string(f.line) : "") + ")";
}

const RankStack* find_rank(const HangFinding& f, int rank) {
  for (const auto& r : f.ranks) {
    if (r.rank == rank) return &r;
  }
  return nullptr;
}

// "node n1 local_rank 1 pid 123, step 3, phase fwd"
std::string where(const RankStack& r) {
  std::string s = "node " + r.node + " local_rank " + std::to_string(r.local_rank) + " pid " +
                  std::to_string(r.pid);
  if (r.step >= 0) s += ", step " + std::to_string(r.step);
  if (!r.phase.empty()) s += ", phase " + r.phase;
  return s;
}

// The innermost frame that names something ("??" says nothing).
const Frame* top_frame(const RankStack& r) {
  for (const auto& fr : main_frames(r.stacks)) {
    if (!fr.function.empty() && fr.function != "??") return &fr;
  }
  return nullptr;
}

std::vector<StackGroup> groups_of(const HangFinding& f) {
  return f.groups.empty() ? merge_stacks(f.ranks) : f.groups;
}

std::vector<std::string> not_taken(const HangFinding& f) {
  if (!f.not_taken.empty()) return f.not_taken;
  std::vector<std::string> out;
  for (const auto& r : f.ranks) {
    if (r.stacks.error.empty()) continue;
    out.push_back("rank " + std::to_string(r.rank) + " (node " + r.node + ", pid " +
                  std::to_string(r.pid) + "): " + r.stacks.error);
  }
  return out;
}

std::string title(const HangFinding& f) {
  if (f.kind == "timer") {
    return "ddprun: hang: torch file timer expired" +
           (f.timer_scope.empty() ? std::string() : " (scope " + f.timer_scope + ")");
  }
  std::string t = "ddprun: hang: no progress for " + seconds(f.waited_s);
  if (f.timeout_s > 0)
    t += " (--hang-timeout=" + fixed(f.timeout_s, f.timeout_s < 10 ? 1 : 0) + ")";
  return t;
}

std::string action_text(const std::string& a) {
  if (a == "report") return "report (--on-hang=report): the job goes on";
  if (a == "dump") return "dump (--on-hang=dump): the job goes on; the stacks stay in the log dir";
  if (a == "restart") {
    return "restart (--on-hang=restart): the workers are stopped and restarted, counted "
           "against --max-restarts";
  }
  if (a == "stop") return "stop (--on-hang=stop): the job is stopped";
  return a;
}

std::string group_label(const StackGroup& g) {
  std::string s = "ranks " + rank_set(g.ranks);
  if (g.ranks.size() > 1) s += " (" + std::to_string(g.ranks.size()) + " ranks)";
  return s;
}

json frame_json(const Frame& fr) {
  json j = {{"function", fr.function}};
  if (!fr.file.empty()) j["file"] = fr.file;
  if (fr.line > 0) j["line"] = fr.line;
  return j;
}

}  // namespace

std::string format_hang(const HangFinding& f) {
  const auto groups = groups_of(f);
  std::ostringstream body;
  if (groups.empty()) body << "No rank's stack arrived.\n";
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const StackGroup& g = groups[gi];
    if (gi == 0) body << "Suspect (smallest group first):\n";
    if (gi == 1) body << "Other groups:\n";
    const RankStack* rep = g.ranks.empty() ? nullptr : find_rank(f, g.ranks.front());
    if (gi > 0) {  // one line: the ranks, and where they are, innermost first
      body << "  " << group_label(g);
      if (g.signature.empty()) {
        body << ": no stack\n";
        continue;
      }
      if (g.in_collective) body << ", in a collective";
      body << ", innermost: ";
      std::size_t shown = 0;
      for (const auto& fr : rep ? main_frames(rep->stacks) : std::vector<Frame>{}) {
        if (fr.function.empty() || fr.function == "??") continue;
        if (shown == kOtherFrames) break;
        body << (shown++ ? " < " : "") << frame_text(fr);
      }
      body << "\n";
      continue;
    }
    if (g.ranks.size() == 1 && rep) {
      body << "  ranks " << g.ranks.front() << " (" << where(*rep) << ")\n";
    } else {
      body << "  " << group_label(g) << ":\n";
      for (std::size_t i = 0; i < g.ranks.size() && i < kSuspectRanksShown; ++i) {
        const RankStack* r = find_rank(f, g.ranks[i]);
        body << "    rank " << g.ranks[i] << " (" << (r ? where(*r) : "unknown") << ")\n";
      }
      if (g.ranks.size() > kSuspectRanksShown) {
        body << "    ... and " << g.ranks.size() - kSuspectRanksShown << " more\n";
      }
    }
    if (g.signature.empty() || !rep) {
      body << "  no stack of these ranks could be taken (below)\n";
      continue;
    }
    std::vector<Frame> frames;  // "??" (no symbol) says nothing on the console
    for (const auto& fr : main_frames(rep->stacks)) {
      if (!fr.function.empty() && fr.function != "??") frames.push_back(fr);
    }
    body << "  stack of rank " << rep->rank << " (" << rep->stacks.tool
         << ", main thread, outermost first" << (g.in_collective ? ", in a collective" : "")
         << "):\n";
    const std::size_t n = frames.size(), first = n > kSuspectFrames ? n - kSuspectFrames : 0;
    if (first > 0) body << "    ... " << first << " outer frames\n";
    for (std::size_t i = n - first; i-- > 0;) body << "    " << frame_text(frames[i]) << "\n";
  }
  const auto missing = not_taken(f);
  if (!missing.empty()) {
    body << "Stacks not taken:\n";
    for (const auto& m : missing) body << "  " << m << "\n";
  }
  if (!f.action.empty()) body << "Action: " << action_text(f.action) << "\n";

  const std::string head = title(f);
  std::size_t width = head.size();
  std::istringstream lines(body.str());
  for (std::string line; std::getline(lines, line);) width = std::max(width, line.size());
  width = std::min(width, kRuleMax);
  std::ostringstream out;
  out << std::string(width, '=') << "\n"
      << head << "\n"
      << std::string(width, '-') << "\n"
      << body.str() << std::string(width, '=') << "\n";
  return out.str();
}

std::string hang_json(const HangFinding& f) {
  const auto groups = groups_of(f);
  json j = {{"kind", f.kind}, {"waited_s", f.waited_s}, {"action", f.action}};
  if (f.timeout_s > 0) j["hang_timeout_s"] = f.timeout_s;
  if (f.kind == "timer") j["timer_scope"] = f.timer_scope;
  json gs = json::array();
  for (const auto& g : groups) {
    gs.push_back({{"ranks", g.ranks},
                  {"ranks_text", rank_set(g.ranks)},
                  {"signature", g.signature},  // function names, outermost first
                  {"in_collective", g.in_collective},
                  {"min_step", g.min_step},
                  {"has_stack", !g.signature.empty()}});
  }
  j["suspect_ranks"] = groups.empty() ? json::array() : json(groups.front().ranks);
  j["groups"] = gs;  // smallest first: the first is the suspect
  json ranks = json::array();
  for (const auto& r : f.ranks) {
    json threads = json::array();
    for (const auto& t : r.stacks.threads) {
      json frames = json::array();
      for (const auto& fr : t.frames) frames.push_back(frame_json(fr));
      threads.push_back({{"name", t.name}, {"main", t.main}, {"frames", frames}});
    }
    json one = {{"rank", r.rank},        {"local_rank", r.local_rank},
                {"node", r.node},        {"pid", r.pid},
                {"step", r.step},        {"phase", r.phase},
                {"tool", r.stacks.tool}, {"threads", threads}};
    if (!r.stacks.error.empty()) one["error"] = r.stacks.error;
    ranks.push_back(std::move(one));
  }
  j["frame_order"] = "innermost first";
  j["ranks"] = ranks;
  j["not_taken"] = not_taken(f);
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string hang_error_message(const HangFinding& f) {
  const auto groups = groups_of(f);
  std::ostringstream out;
  out << title(f) << ".";
  if (groups.empty() || groups.front().signature.empty()) {
    out << " No stack could be taken, so no rank is named.";
  } else {
    const StackGroup& g = groups.front();
    out << " Suspect " << (g.ranks.size() == 1 ? "rank " : "ranks ") << rank_set(g.ranks) << " (";
    for (std::size_t i = 0; i < g.ranks.size() && i < kSuspectRanksShown; ++i) {
      const RankStack* r = find_rank(f, g.ranks[i]);
      if (i) out << "; ";
      if (g.ranks.size() > 1) out << "rank " << g.ranks[i] << ": ";
      if (r) out << "node " << r->node << ", local rank " << r->local_rank << ", pid " << r->pid;
    }
    if (g.ranks.size() > kSuspectRanksShown) out << "; ...";
    out << ")";
    const RankStack* rep = find_rank(f, g.ranks.front());
    if (const Frame* top = rep ? top_frame(*rep) : nullptr) out << " is in " << frame_text(*top);
    out << (g.in_collective ? ", inside a collective" : ", outside any collective") << ".";
    std::size_t others = 0;
    for (std::size_t i = 1; i < groups.size(); ++i) others += groups[i].ranks.size();
    if (others > 0) {
      const StackGroup& next = groups[1];
      const RankStack* nr = next.ranks.empty() ? nullptr : find_rank(f, next.ranks.front());
      const Frame* top = nr ? top_frame(*nr) : nullptr;
      out << " " << others << " other rank" << (others == 1 ? "" : "s") << " in "
          << groups.size() - 1 << " group" << (groups.size() == 2 ? "" : "s");
      if (top) {
        out << (next.ranks.size() == 1 ? "; rank " : "; ranks ") << rank_set(next.ranks)
            << (next.ranks.size() == 1 ? " is in " : " are in ") << frame_text(*top);
      }
      out << ".";
    }
  }
  if (!f.action.empty()) out << " Action: " << f.action << ".";
  return out.str();
}

std::string format_straggler(const StragglerFinding& s) {
  std::string out = "ddprun: straggler: rank " + std::to_string(s.rank) + " (node " + s.node +
                    ", local rank " + std::to_string(s.local_rank) + ") takes " +
                    seconds(s.step_s) + " per step";
  if (s.median_s > 0) {
    out += ", " + fixed(s.step_s / s.median_s, 1) + "x the job's median " + seconds(s.median_s);
  }
  out += " (over " + std::to_string(s.steps) + " steps)";
  return out;
}

std::string stragglers_json(const std::vector<StragglerFinding>& s) {
  json all = json::array();
  for (const auto& f : s) {
    all.push_back({{"rank", f.rank},
                   {"local_rank", f.local_rank},
                   {"node", f.node},
                   {"step_s", f.step_s},
                   {"median_s", f.median_s},
                   {"ratio", f.median_s > 0 ? f.step_s / f.median_s : 0.0},
                   {"steps", f.steps}});
  }
  return json({{"stragglers", all}}).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace ddp::launch
