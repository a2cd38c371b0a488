// Prometheus text for the status records and the store's counters (metrics.hpp). Each family
// is written whole (its samples contiguous, as format 0.0.4 wants) over every job, node and
// rank; the label strings of nodes and ranks are built once and reused by every family.
#include "ddp/status/metrics.hpp"

#include "metrics_family.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ddp::status {

namespace {

using namespace detail;

bool live_rank_state(const std::string& s) {
  return s == "starting" || s == "running" || s == "hung";
}

std::vector<JobView> index_jobs(const std::vector<JobStatus>& jobs) {
  std::vector<const JobStatus*> sorted;
  for (const auto& j : jobs) sorted.push_back(&j);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const JobStatus* a, const JobStatus* b) { return a->run_id < b->run_id; });
  std::vector<JobView> out;
  for (const JobStatus* j : sorted) {
    if (!out.empty() && out.back().j->run_id == j->run_id) continue;  // one series per run
    JobView jv{j, {}, {}};
    append_label(jv.labels, "run_id", j->run_id);
    std::vector<const NodeStatus*> nodes;
    for (const auto& n : j->nodes) nodes.push_back(&n);
    std::stable_sort(nodes.begin(), nodes.end(),
                     [](const NodeStatus* a, const NodeStatus* b) { return a->slot < b->slot; });
    for (const NodeStatus* n : nodes) {
      if (!jv.nodes.empty() && jv.nodes.back().n->slot == n->slot) continue;
      NodeView nv{n, jv.labels, {}};
      append_label(nv.labels, "node", n->host + ":" + std::to_string(n->slot));
      std::vector<const RankStatus*> ranks;
      for (const auto& r : n->ranks) ranks.push_back(&r);
      std::stable_sort(ranks.begin(), ranks.end(), [](const RankStatus* a, const RankStatus* b) {
        return a->local_rank < b->local_rank;
      });
      for (const RankStatus* r : ranks) {
        if (!nv.ranks.empty() && nv.ranks.back().r->local_rank == r->local_rank) continue;
        RankView rv{r, nv.labels, !n->lost && live_rank_state(r->state)};
        append_label(rv.labels, "rank", std::to_string(r->rank));
        append_label(rv.labels, "local_rank", std::to_string(r->local_rank));
        nv.ranks.push_back(std::move(rv));
      }
      jv.nodes.push_back(std::move(nv));
    }
    out.push_back(std::move(jv));
  }
  return out;
}

void render_jobs(std::string& out, const std::vector<JobView>& jobs) {
  {
    Family f(out, "ddprun_jobs", "gauge", "Jobs (run ids) this exposition describes.");
    f.sample("", static_cast<std::uint64_t>(jobs.size()));
  }
  auto per_job = [&](std::string_view name, std::string_view type, std::string_view help,
                     const std::function<void(Family&, const JobView&)>& emit) {
    Family f(out, name, type, help);
    for (const auto& j : jobs) emit(f, j);
  };
  per_job("ddprun_job_state", "gauge",
          "1 for the job's state (running, rendezvous, restarting, succeeded, failed, stopped, "
          "mixed, lost, unknown), as derived from its nodes.",
          [](Family& f, const JobView& j) {
            f.sample(j.labels, 1, "state", j.j->state.empty() ? "unknown" : j.j->state);
          });
  per_job("ddprun_job_round", "gauge", "The newest rendezvous round of the job (-1: none yet).",
          [](Family& f, const JobView& j) { f.sample(j.labels, j.j->round); });
  per_job("ddprun_job_members", "gauge", "Nodes (agents) in the job's newest round.",
          [](Family& f, const JobView& j) { f.sample(j.labels, j.j->members); });
  per_job("ddprun_job_ranks", "gauge", "Workers (ranks) of the members of the newest round.",
          [](Family& f, const JobView& j) { f.sample(j.labels, j.j->ranks); });
  per_job("ddprun_job_restarts_total", "counter",
          "Restarts of the job's workers: the highest restart count of any node.",
          [](Family& f, const JobView& j) { f.sample(j.labels, j.j->restarts); });
  per_job("ddprun_job_max_restarts", "gauge", "The job's restart budget (--max-restarts).",
          [](Family& f, const JobView& j) {
            if (j.nodes.empty()) return;
            int m = 0;
            for (const auto& n : j.nodes) m = std::max(m, n.n->max_restarts);
            f.sample(j.labels, m);
          });
  // Each node counts the failures of its own workers, so the job's count is the sum.
  per_job("ddprun_failures_total", "counter",
          "Worker failures of the job by cause (exitcode, signal, oom, hang, node_lost, spawn, "
          "store_lost, other), summed over the nodes where they happened.",
          [](Family& f, const JobView& j) {
            std::map<std::string, std::int64_t> sum;
            for (const char* c : kCauses) sum[c] = 0;
            for (const auto& n : j.nodes) {
              for (const auto& [cause, count] : n.n->failures_by_cause) sum[cause] += count;
            }
            for (const char* c : kCauses) f.sample(j.labels, sum[c], "cause", c);
            for (const auto& [cause, count] : sum) {
              if (std::none_of(std::begin(kCauses), std::end(kCauses),
                               [&](const char* c) { return cause == c; })) {
                f.sample(j.labels, count, "cause", cause);
              }
            }
          });
}

void render_nodes(std::string& out, const std::vector<JobView>& jobs) {
  auto per_node = [&](std::string_view name, std::string_view type, std::string_view help,
                      const std::function<void(Family&, const NodeView&)>& emit) {
    Family f(out, name, type, help);
    for (const auto& j : jobs) {
      for (const auto& n : j.nodes) emit(f, n);
    }
  };
  per_node("ddprun_node_up", "gauge",
           "1 while the node's agent publishes its record (or has ended), 0 when it is lost.",
           [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->lost ? 0 : 1); });
  per_node("ddprun_node_state", "gauge",
           "1 for the agent's state (rendezvous, running, restarting, stopping, succeeded, "
           "failed, stopped, lost).",
           [](Family& f, const NodeView& n) {
             f.sample(n.labels, 1, "state", n.n->lost ? std::string("lost") : n.n->state);
           });
  per_node("ddprun_node_round", "gauge", "The rendezvous round the node is in (-1: none yet).",
           [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->round); });
  per_node("ddprun_node_restarts_total", "counter", "Restarts of this node's workers.",
           [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->restart_count); });
  per_node("ddprun_node_heals_total", "counter",
           "Workers of the node replaced in place (in-place recovery).",
           [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->heals); });
  per_node("ddprun_node_store_outages_total", "counter",
           "Times the node's agent lost the rendezvous store and rode it out.",
           [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->store_outages); });
  per_node("ddprun_node_store_outage_seconds_total", "counter",
           "Seconds the node's agent was without its rendezvous store.",
           [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->store_outage_s); });
  per_node(
      "ddprun_node_store_away", "gauge",
      "1 while the node's agent is without its rendezvous store, else 0.",
      [](Family& f, const NodeView& n) { f.sample(n.labels, n.n->store_away_s >= 0 ? 1 : 0); });
  per_node("ddprun_node_start_time_seconds", "gauge",
           "When the node's agent started, in seconds since the Unix epoch.",
           [](Family& f, const NodeView& n) {
             if (n.n->started_unix > 0) f.sample(n.labels, n.n->started_unix);
           });
  per_node("ddprun_node_last_update_timestamp_seconds", "gauge",
           "When the node last published its record, in seconds since the Unix epoch.",
           [](Family& f, const NodeView& n) {
             if (n.n->updated_unix > 0) f.sample(n.labels, n.n->updated_unix);
           });
  per_node("ddprun_node_history_bytes", "gauge",
           "Memory the agent's metric histories take (bounded: 17 series x 512 points a rank).",
           [](Family& f, const NodeView& n) {
             if (n.n->history_bytes > 0) f.sample(n.labels, n.n->history_bytes);
           });
}

void render_ranks(std::string& out, const std::vector<JobView>& jobs) {
  auto per_rank = [&](std::string_view name, std::string_view type, std::string_view help,
                      const std::function<void(Family&, const RankView&)>& emit) {
    Family f(out, name, type, help);
    for (const auto& j : jobs) {
      for (const auto& n : j.nodes) {
        for (const auto& r : n.ranks) emit(f, r);
      }
    }
  };
  per_rank("ddprun_rank_state", "gauge",
           "1 for the worker's state (starting, running, succeeded, failed, stopped, hung, lost); "
           "one series per rank.",
           [](Family& f, const RankView& r) { f.sample(r.labels, 1, "state", r.r->state); });
  per_rank("ddprun_rank_restarts_total", "counter", "Restarts of this local rank in the job.",
           [](Family& f, const RankView& r) { f.sample(r.labels, r.r->restarts); });
  per_rank("ddprun_rank_last_exit_code", "gauge",
           "The worker's last exit code (-N: killed by signal N), once it has exited.",
           [](Family& f, const RankView& r) {
             if (r.r->last_exit) f.sample(r.labels, *r.r->last_exit);
           });
  per_rank("ddprun_rank_step", "gauge", "The last training step the worker reported.",
           [](Family& f, const RankView& r) {
             if (r.r->step >= 0) f.sample(r.labels, r.r->step);
           });
  per_rank("ddprun_rank_total_steps", "gauge", "The steps the worker said it will run.",
           [](Family& f, const RankView& r) {
             if (r.r->total_steps >= 0) f.sample(r.labels, r.r->total_steps);
           });
  per_rank("ddprun_rank_step_seconds", "gauge", "Median duration of the worker's recent steps.",
           [](Family& f, const RankView& r) {
             if (r.r->step_time_s > 0) f.sample(r.labels, r.r->step_time_s);
           });
  per_rank("ddprun_rank_samples_per_second", "gauge",
           "The worker's throughput, when it reports samples per step.",
           [](Family& f, const RankView& r) {
             if (r.r->samples_per_s > 0) f.sample(r.labels, r.r->samples_per_s);
           });
  // Sampled from /proc and NVML: only for a process that is there.
  per_rank("ddprun_rank_cpu_ratio", "gauge",
           "CPU used by the worker over the last interval, in CPUs (1 = one core busy).",
           [](Family& f, const RankView& r) {
             if (r.live) f.sample(r.labels, r.r->cpu_frac);
           });
  per_rank("ddprun_rank_rss_bytes", "gauge", "Resident memory of the worker process.",
           [](Family& f, const RankView& r) {
             if (r.live) f.sample(r.labels, r.r->rss_bytes);
           });
  const std::string gpu = "gpu";
  per_rank("ddprun_rank_gpu_utilization_ratio", "gauge",
           "Utilization (0 to 1) of the GPU the worker runs on, from NVML.",
           [&](Family& f, const RankView& r) {
             if (r.live && r.r->gpu_util) {
               f.sample(r.labels, *r.r->gpu_util, gpu, std::to_string(r.r->gpu));
             }
           });
  per_rank("ddprun_rank_gpu_memory_used_bytes", "gauge",
           "Memory used on the GPU the worker runs on (the whole device), from NVML.",
           [&](Family& f, const RankView& r) {
             if (r.live && r.r->gpu_mem_used) {
               f.sample(r.labels, *r.r->gpu_mem_used, gpu, std::to_string(r.r->gpu));
             }
           });
  per_rank("ddprun_rank_gpu_memory_total_bytes", "gauge",
           "Memory of the GPU the worker runs on, from NVML.", [&](Family& f, const RankView& r) {
             if (r.live && r.r->gpu_mem_total) {
               f.sample(r.labels, *r.r->gpu_mem_total, gpu, std::to_string(r.r->gpu));
             }
           });
}

void render_store(std::string& out, const rdzv::ServerStats& s) {
  auto one = [&](std::string_view name, std::string_view type, std::string_view help,
                 std::uint64_t v) {
    Family f(out, name, type, help);
    f.sample("", v);
  };
  one("ddprun_store_connections", "gauge", "Client connections open now.", s.connections_open);
  one("ddprun_store_connections_total", "counter", "Client connections accepted.",
      s.connections_total);
  one("ddprun_store_connections_refused_total", "counter",
      "Connections refused over the connection limit.", s.connections_refused);
  {
    Family f(out, "ddprun_store_requests_total", "counter",
             "Requests served, by operation (wait includes barrier, set includes "
             "set_with_lease).");
    for (std::size_t i = 0; i < rdzv::kOpKinds; ++i) {
      f.sample("", s.requests_by_op[i], "op", rdzv::op_kind_name(static_cast<rdzv::OpKind>(i)));
    }
  }
  one("ddprun_store_received_bytes_total", "counter", "Bytes read from clients.", s.bytes_received);
  one("ddprun_store_sent_bytes_total", "counter", "Bytes written to clients.", s.bytes_sent);
  one("ddprun_store_protocol_errors_total", "counter",
      "Connections closed for a bad request (all closing errors).", s.protocol_errors);
  one("ddprun_store_frame_timeouts_total", "counter",
      "Connections closed for a request not finished within --frame-timeout.", s.frame_timeouts);
  one("ddprun_store_over_budget_total", "counter",
      "Connections closed for going over a memory budget.", s.over_budget);
  one("ddprun_store_client_bytes", "gauge",
      "Memory held for connections now (unparsed input, unsent replies, waits).", s.client_bytes);
  one("ddprun_store_keys", "gauge", "Keys in the store now.", s.keys);
  one("ddprun_store_table_bytes", "gauge",
      "Keys, values and queued items now, each with 64 bytes of overhead (--max-store-bytes "
      "bounds it).",
      s.table_bytes);
  one("ddprun_store_leases", "gauge", "Live leases now.", s.leases);
  one("ddprun_store_auth_total", "counter", "Connections that authenticated with the job's secret.",
      s.auth_ok);
  {
    Family f(out, "ddprun_store_refused_total", "counter",
             "Connections refused by access (docs/security.md), by reason: address (outside the "
             "trusted networks of a closed store), unauthenticated (a request before "
             "authenticating), auth_failed (a wrong proof), user (another user's socket on "
             "loopback), plain (a plain connection from off the host to a TLS-only store), tls (a "
             "failed TLS handshake: no or an untrusted client certificate).");
    f.sample("", s.refused_address, "reason", "address");
    f.sample("", s.refused_unauthenticated, "reason", "unauthenticated");
    f.sample("", s.refused_user, "reason", "user");
    f.sample("", s.auth_failures, "reason", "auth_failed");
    f.sample("", s.refused_plain, "reason", "plain");
    f.sample("", s.refused_tls, "reason", "tls");
  }
  one("ddprun_store_tls_connections_total", "counter",
      "Connections served over TLS (docs/security.md, \"TLS on the store\").", s.tls_connections);
}

// The length of the valid UTF-8 sequence at s[i], or 0 if it is not one.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  std::size_t n = b < 0x80           ? 1
                  : (b >> 5) == 0x6  ? 2
                  : (b >> 4) == 0xE  ? 3
                  : (b >> 3) == 0x1E ? 4
                                     : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  }
  return n;
}

}  // namespace

// Prometheus refuses label values that are not UTF-8: a stray byte becomes '?'.
std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size();) {
    const std::size_t n = utf8_length(value, i);
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(value.substr(i, n));
      i += n;
      continue;
    }
    const char c = value[i++];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string render_metrics(const std::vector<JobStatus>& jobs,
                           const std::optional<rdzv::ServerStats>& store) {
  const std::vector<JobView> view = index_jobs(jobs);
  std::string out;
  render_jobs(out, view);
  render_nodes(out, view);
  render_ranks(out, view);
  detail::render_training(out, view);
  if (store) render_store(out, *store);
  return out;
}

}  // namespace ddp::status
