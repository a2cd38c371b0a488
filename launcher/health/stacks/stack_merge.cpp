// STAT-style grouping of ranks by their main thread's stack (see stack_merge.hpp), the
// collective-frame test behind its tie-break, and the compact JSON of stacks (stacks.hpp) and
// of one node's ranks for the store: the main thread and 3 others, the innermost 64 frames.
#include "ddp/launch/stack_merge.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ddp/proto/error.hpp"
#include "stack_text.hpp"

namespace ddp::launch {
namespace {

using nlohmann::json;
using stack_text::clip;
using stack_text::json_string;

constexpr std::size_t kMaxThreadsOut = 4;  // in the store: the main thread and 3 others
constexpr std::size_t kMaxFramesOut = 64;  // in the store: the innermost 64 per thread
constexpr std::size_t kMaxNameOut = 256;   // bytes of a function, file or thread name

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// {"pid", "tool", "threads": [{"name", "main", "frames": [[function, file, line], ...]}], "error"}
json process_json(const ProcessStacks& p) {
  std::vector<const ThreadStack*> order;  // the main thread first
  for (const auto& t : p.threads) {
    if (t.main) order.push_back(&t);
  }
  for (const auto& t : p.threads) {
    if (!t.main) order.push_back(&t);
  }
  json threads = json::array();
  for (std::size_t k = 0; k < order.size() && k < kMaxThreadsOut; ++k) {
    const ThreadStack& t = *order[k];
    json frames = json::array();
    for (std::size_t i = 0; i < t.frames.size() && i < kMaxFramesOut; ++i) {
      const Frame& f = t.frames[i];
      frames.push_back(
          json::array({clip(f.function, kMaxNameOut), clip(f.file, kMaxNameOut), f.line}));
    }
    threads.push_back({{"name", clip(t.name, kMaxNameOut)}, {"main", t.main}, {"frames", frames}});
  }
  json one = {{"pid", p.pid}, {"tool", p.tool}, {"threads", threads}};
  if (!p.error.empty()) one["error"] = clip(p.error, 1024);
  return one;
}

ProcessStacks process_from_json(const json& p) {
  auto bad = [](const std::string& what) { return ProtocolError("stacks: " + what); };
  auto pid = p.is_object() ? p.find("pid") : p.end();
  if (!p.is_object() || pid == p.end() || !pid->is_number_integer()) {
    throw bad("a process without an integer 'pid'");
  }
  ProcessStacks ps;
  ps.pid = pid->get<pid_t>();
  ps.tool = json_string(p, "tool");
  ps.error = json_string(p, "error");
  auto threads = p.find("threads");
  if (threads != p.end() && !threads->is_array()) throw bad("'threads' is not an array");
  for (const auto& t : threads != p.end() ? *threads : json::array()) {
    if (!t.is_object()) throw bad("a thread is not an object");
    ThreadStack ts;
    ts.name = json_string(t, "name");
    auto main = t.find("main");
    ts.main = main != t.end() && main->is_boolean() && main->get<bool>();
    auto frames = t.find("frames");
    if (frames != t.end() && !frames->is_array()) throw bad("'frames' is not an array");
    for (const auto& f : frames != t.end() ? *frames : json::array()) {
      if (!f.is_array() || f.size() != 3 || !f[0].is_string() || !f[1].is_string() ||
          !f[2].is_number_integer()) {
        throw bad("a frame is not [function, file, line]");
      }
      ts.frames.push_back({f[0].get<std::string>(), f[1].get<std::string>(), f[2].get<int>()});
    }
    ps.threads.push_back(std::move(ts));
  }
  return ps;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool address_only(const std::string& f) {
  if (f.size() < 3 || f[0] != '0' || (f[1] != 'x' && f[1] != 'X')) return false;
  return std::all_of(f.begin() + 2, f.end(),
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

// A rank whose step is unknown (-1) sorts after every known step.
std::int64_t step_key(std::int64_t step) {
  return step < 0 ? std::numeric_limits<std::int64_t>::max() : step;
}

}  // namespace

std::vector<std::string> stack_signature(const std::vector<Frame>& innermost_first) {
  std::vector<std::string> sig;
  for (auto it = innermost_first.rbegin(); it != innermost_first.rend(); ++it) {
    const std::string& f = it->function;
    if (f.empty() || f == "??" || address_only(f)) continue;  // says nothing about the call
    // A Python frame's line tells two places in one function apart (a rank asleep on line 9,
    // the others on line 11); native frames are grouped by function alone, as STAT does.
    sig.push_back(!it->file.empty() && it->line > 0 ? f + ":" + std::to_string(it->line) : f);
  }
  return sig;
}

bool is_collective_frame(const std::string& function) {
  // The function's own name, not its arguments: "gloo::(anonymous namespace)::allreduce(...)".
  std::string f = lower(function);
  for (auto at = f.find("(anonymous namespace)"); at != std::string::npos;
       at = f.find("(anonymous namespace)")) {
    f.erase(at, 21);
  }
  f = f.substr(0, f.find('('));
  // Its identifiers ("c10d::work::wait" -> c10d, work, wait), leading underscores dropped.
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < f.size();) {
    auto word = [&](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    if (!word(f[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < f.size() && word(f[j])) ++j;
    const auto k = f.find_first_not_of('_', i);
    if (k < j) ids.push_back(f.substr(k, j - k));
    i = j;
  }
  // An identifier that starts with a collective's name: torch.distributed (all_reduce,
  // all_gather_into_tensor, _store_based_barrier...), gloo (allreduce, waitRecv), NCCL
  // (ncclAllReduce), ddp-train's communicators (worker_runtime/src/{gloo,shm,nccl}_comm.cpp:
  // all_reduce_sum, broadcast, barrier, all_gather, arrive_and_wait, wait_stream, wait_ready,
  // wait_all). A name that only ends with one (injected_hang_before_allreduce) is no collective.
  static const char* const kStarts[] = {
      "all_reduce",        "allreduce",       "all_gather",        "allgather",
      "reduce_scatter",    "reducescatter",   "all_to_all",        "alltoall",
      "broadcast",         "barrier",         "monitored_barrier", "store_based_barrier",
      "batch_isend_irecv", "arrive_and_wait", "wait_stream",       "wait_ready",
      "wait_all",          "waitrecv",        "waitsend",          "ncclallreduce",
      "ncclallgather",     "ncclbroadcast",   "ncclreducescatter", "ncclreduce",
      "ncclgroupend",      "ncclsend",        "ncclrecv"};
  const bool in_comm_lib =
      f.find("c10d::") != std::string::npos || f.find("gloo::") != std::string::npos;
  for (const auto& id : ids) {
    for (const char* p : kStarts) {
      if (id.rfind(p, 0) == 0) return true;
    }
    // c10d::Work::wait, WorkNCCL::synchronize, gloo's ...::waitRecv
    if (in_comm_lib && (id.rfind("wait", 0) == 0 || id.rfind("synchronize", 0) == 0)) return true;
  }
  // ddp-train's main thread waits for its bucketed all-reduce here.
  if (f.find("gradreducer::finish") != std::string::npos) return true;
  // torch.distributed's point-to-point calls appear in py-spy under their bare names.
  static const char* const kExact[] = {"send", "recv", "isend", "irecv"};
  return std::any_of(std::begin(kExact), std::end(kExact),
                     [&](const char* e) { return function == e; });
}

std::vector<StackGroup> merge_stacks(const std::vector<RankStack>& ranks) {
  // When only some ranks stalled, stalled and progressing ranks never share a group, even in
  // the same stack (a loop that sleeps between steps looks alike in both).
  const bool some = std::any_of(ranks.begin(), ranks.end(), [](auto& r) { return r.stalled; });
  const bool all = std::all_of(ranks.begin(), ranks.end(), [](auto& r) { return r.stalled; });
  const bool partial = some && !all;
  // Key: (no stack taken, stalled while others are not, signature). Ranks without a stack form
  // one group of their own. Value: the group, and whether every rank of it reports a
  // collective phase.
  std::map<std::tuple<bool, bool, std::vector<std::string>>, std::pair<StackGroup, bool>> by_sig;
  for (const auto& r : ranks) {
    auto sig = stack_signature(main_frames(r.stacks));
    const bool missing = sig.empty();
    auto [it, fresh] = by_sig.try_emplace({missing, partial && r.stalled, sig});
    auto& [g, phases] = it->second;
    if (fresh) {
      g.signature = sig;
      g.in_collective = std::any_of(sig.begin(), sig.end(), is_collective_frame);
      phases = true;
    }
    phases = phases && is_collective_frame(r.phase);
    g.ranks.push_back(r.rank);
    g.stalled = g.stalled || r.stalled;
    if (r.step >= 0 && (g.min_step < 0 || r.step < g.min_step)) g.min_step = r.step;
  }
  std::vector<StackGroup> out;
  for (auto& [key, value] : by_sig) {
    auto& [g, phases] = value;
    std::sort(g.ranks.begin(), g.ranks.end());
    g.ranks.erase(std::unique(g.ranks.begin(), g.ranks.end()), g.ranks.end());
    // ddp-train's phase says "allreduce" where its main thread's frames (a condition variable
    // in the reducer) may not.
    g.in_collective = g.in_collective || (phases && !g.signature.empty());
    out.push_back(std::move(g));
  }
  // When only some ranks stalled, their groups first (the others still make progress). Then
  // smallest first; then a group outside any collective (the others wait for it); then the
  // least progress; then the lowest rank. A group without a stack says nothing: last.
  std::sort(out.begin(), out.end(), [partial](const StackGroup& a, const StackGroup& b) {
    auto key = [partial](const StackGroup& g) {
      return std::make_tuple(g.signature.empty(), partial && !g.stalled, g.ranks.size(),
                             g.in_collective, step_key(g.min_step),
                             g.ranks.empty() ? 0 : g.ranks.front());
    };
    return key(a) < key(b);
  });
  return out;
}

std::string stacks_to_json(const std::vector<ProcessStacks>& stacks) {
  json all = json::array();
  for (const auto& p : stacks) all.push_back(process_json(p));
  return dump(all);
}

std::vector<ProcessStacks> stacks_from_json(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    throw ProtocolError("stacks: not a JSON array (" + clip(std::string(text), 80) + ")");
  }
  std::vector<ProcessStacks> out;
  for (const auto& p : j) out.push_back(process_from_json(p));
  return out;
}

std::string rank_stacks_to_json(const std::vector<RankStack>& ranks) {
  json all = json::array();
  for (const auto& r : ranks) {
    all.push_back({{"rank", r.rank},
                   {"local_rank", r.local_rank},
                   {"node", clip(r.node, kMaxNameOut)},
                   {"pid", r.pid},
                   {"step", r.step},
                   {"phase", clip(r.phase, kMaxNameOut)},
                   {"stacks", process_json(r.stacks)}});
  }
  return dump(all);
}

std::vector<RankStack> rank_stacks_from_json(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    throw ProtocolError("rank stacks: not a JSON array (" + clip(std::string(text), 80) + ")");
  }
  std::vector<RankStack> out;
  for (const auto& e : j) {
    if (!e.is_object()) throw ProtocolError("rank stacks: an entry is not an object");
    auto integer = [&](const char* key) -> long long {
      auto it = e.find(key);
      if (it == e.end() || !it->is_number_integer()) {
        throw ProtocolError(std::string("rank stacks: '") + key + "' is missing or not an integer");
      }
      return it->get<long long>();
    };
    RankStack r;
    r.rank = static_cast<int>(integer("rank"));
    r.local_rank = static_cast<int>(integer("local_rank"));
    r.pid = static_cast<pid_t>(integer("pid"));
    r.step = e.contains("step") ? integer("step") : -1;
    r.node = json_string(e, "node");
    r.phase = json_string(e, "phase");
    auto s = e.find("stacks");
    if (s == e.end() || !s->is_object()) {
      throw ProtocolError("rank stacks: 'stacks' is missing or not an object");
    }
    r.stacks = process_from_json(*s);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ddp::launch
