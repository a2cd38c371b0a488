// The agent's status at exit (status_reporter.hpp): the last publication with the final state,
// the trace (each node sets its part in the store; group rank 0 waits a little for the others'
// and writes the file) and the summary on stderr.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ddp/launch/status_reporter.hpp"
#include "ddp/launch/status_text.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/status/job_view.hpp"

namespace ddp::launch {

namespace {
constexpr std::chrono::seconds kTraceWait{10};  // for the other nodes' parts of the trace
constexpr int kFinalPolls = 30;                 // x 100 ms for the others' final records

// All `members` nodes of `round` are in the view, each with a final state (or lost). A node
// missing from the view has not published yet (a job shorter than the status interval): its
// final record is on its way, and without it the summary would count this node's alone.
bool round_over(const status::JobStatus& job, int round, int members) {
  int seen = 0;
  for (const auto& n : job.nodes) {
    if (n.round != round) continue;
    ++seen;
    if (!n.lost && !status::final_state(n.state)) return false;
  }
  return seen >= members;
}
}  // namespace

NodeTrace StatusReporter::node_trace() const {
  std::lock_guard<std::mutex> g(mu_);
  NodeTrace t;
  t.slot = node_.slot;
  t.host = node_.host;
  t.group_rank = node_.group_rank;
  t.phases = all_phases_;
  for (const auto& [lr, rt] : steps_) t.ranks[lr] = rt.steps;
  return t;
}

status::JobStatus StatusReporter::final_job() {
  if (store_) {
    try {
      return status::read_job(*store_, s_.run_id, status::unix_now());
    } catch (const Error&) {
      store_.reset();
    }
  }
  status::JobStatus job;
  job.run_id = s_.run_id;
  job.now_unix = status::unix_now();
  job.nodes.push_back(snapshot());
  status::fill_derived(job);
  return job;
}

void StatusReporter::write_trace(const status::JobStatus& job) {
  std::vector<NodeTrace> parts{node_trace()};
  const int self = parts[0].slot;
  if (store_) {
    std::vector<std::string> keys;
    for (const auto& n : job.nodes) {
      if (n.slot != self && n.round == node_.round) {
        keys.push_back(status::trace_key(s_.run_id, n.slot));
      }
    }
    try {
      if (!keys.empty()) {
        try {
          store_->wait(keys, kTraceWait);
        } catch (const TimeoutError&) {
          std::fprintf(stderr,
                       "ddprun: trace: not every node handed in its part within %lld s; "
                       "writing what came\n",
                       static_cast<long long>(kTraceWait.count()));
        }
      }
      for (const auto& k : keys) {
        if (!store_->check({k})) continue;
        try {
          parts.push_back(decode_node_trace(store_->get(k)));
        } catch (const ProtocolError& e) {
          std::fprintf(stderr, "ddprun: trace: a node's part was unreadable (%s)\n", e.what());
        }
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "ddprun: trace: the store failed (%s); writing this node's part\n",
                   e.what());
    }
  }
  const std::string tmp = s_.trace_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << chrome_trace(parts);
    if (!out.flush()) {
      std::fprintf(stderr, "ddprun: trace: cannot write %s\n", tmp.c_str());
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, s_.trace_path, ec);
  if (ec) {
    std::fprintf(stderr, "ddprun: trace: cannot write %s: %s\n", s_.trace_path.c_str(),
                 ec.message().c_str());
    return;
  }
  std::fprintf(stderr,
               "ddprun: trace of %zu node(s) written to %s (open it in "
               "https://ui.perfetto.dev or chrome://tracing)\n",
               parts.size(), s_.trace_path.c_str());
}

void StatusReporter::finish(const std::string& state, int exit_code) {
  if (finished_) return;
  finished_ = true;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  const double now = status::unix_now();
  status::NodeStatus copy;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!node_.phases.empty() && node_.phases.back().end_unix == 0) {
      node_.phases.back().end_unix = now;
    }
    if (!all_phases_.empty() && all_phases_.back().end_unix == 0) all_phases_.back().end_unix = now;
    node_.state = state;
    for (auto& r : node_.ranks) {
      if (r.state == "running" || r.state == "starting" || r.state == "hung") r.state = "stopped";
      r.cpu_frac = 0;
    }
    copy = node_;
  }
  if (tty_line_) std::fputs("\n", stderr);
  if (store_) {
    try {
      status::publish(*store_, copy, now);
      if (!s_.trace_path.empty()) {
        store_->set(status::trace_key(s_.run_id, copy.slot), encode_node_trace(node_trace()));
      }
    } catch (const Error&) {
      store_.reset();  // the store went first (its host ended): the summary is this node's
    }
  }
  const bool writes_trace = !s_.trace_path.empty() && (copy.group_rank <= 0 || !store_);
  status::JobStatus job;
  if (writes_trace || (s_.summary && s_.progress != ProgressMode::off)) {
    job = final_job();
    // The other nodes of the round end at about the same time: give their final records a
    // moment (bounded) so that the summary shows how the job ended, not how it was running.
    for (int i = 0;
         i < kFinalPolls && store_ && !round_over(job, copy.round, copy.group_world_size); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      job = final_job();
    }
  }
  if (writes_trace) write_trace(job);
  if (s_.summary && s_.progress != ProgressMode::off) {
    const std::string text = format_exit_summary(job, now - started_, exit_code);
    if (!text.empty()) std::fputs(text.c_str(), stderr);
  }
}

}  // namespace ddp::launch
