// The live status of a job, as every view shows it (docs/status.md): each agent keeps one
// NodeStatus and publishes it to the rendezvous store at a fixed interval; `ddprun status`,
// the HTTP views of ddprund and the agents, the metrics and the exit summary all read these
// records. Pure data and its JSON codec (the versioned schema docs/status.schema.json).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/status/metric_history.hpp"

namespace ddp::status {

inline constexpr int kSchemaVersion = 1;

// A worker's state as the views name it.
//   starting: spawned, nothing reported yet; running; succeeded (exit 0); failed (non-zero exit
//   or a signal of its own); stopped (ended by the agent: a restart, a stop); hung (named by the
//   hang monitor); lost (its node stopped publishing; set by readers only).
struct RankStatus {
  int local_rank = 0;
  int rank = 0;  // global rank in the node's current round
  int pid = 0;
  std::string state = "starting";
  int restarts = 0;                // times this local rank was restarted in this job
  std::optional<int> last_exit;    // the last exit code (-N: signal N), if it ever exited
  std::string last_error;          // one line: "exitcode 1", "signal 9 (SIGKILL)", "OOM killed"
  std::int64_t step = -1;          // the last step from the progress channel (-1: none)
  double step_time_s = 0;          // median of the recent step durations (0: unknown)
  double samples_per_s = 0;        // when the worker reports samples per step (0: unknown)
  std::int64_t total_steps = -1;   // when the worker reports it (-1: unknown)
  double cpu_frac = 0;             // share of one CPU over the last interval
  std::uint64_t rss_bytes = 0;     // resident memory of the worker process
  int gpu = -1;                    // the device index it runs on (-1: none or unknown)
  std::optional<double> gpu_util;  // 0..1, from NVML when loadable
  std::optional<std::uint64_t> gpu_mem_used;
  std::optional<std::uint64_t> gpu_mem_total;
  // The latest value of every metric the worker reports on its progress line (loss=, lr=, ...;
  // samples_per_s when it reports samples=), at most kMaxRankMetrics; the metric values it sent
  // that were not numbers or had bad names, or came past kMaxRankMetrics.
  std::map<std::string, double> metrics;
  std::uint64_t bad_metrics = 0;
};

// A launcher phase of this node (rendezvous, spawn, run, restart, stop), wall clock.
struct Phase {
  std::string name;
  double start_unix = 0;
  double end_unix = 0;  // 0: still going
  std::string detail;
};

// Why the workers of this node were restarted or stopped once.
struct RestartEvent {
  int round = 0;
  double at_unix = 0;
  std::string cause;  // one of kCauses
  std::string what;   // the agent's one-line description
};

// Failure and restart causes, as the metrics label them (node_joined: an elastic re-form).
inline constexpr const char* kCauses[] = {"exitcode", "signal",     "oom",
                                          "hang",     "node_lost",  "node_joined",
                                          "spawn",    "store_lost", "other"};

struct NodeStatus {
  int schema = kSchemaVersion;
  std::string run_id;
  std::string job_id;  // SLURM_JOB_ID when under Slurm, else ""
  std::string host;
  int slot = 0;  // this agent's index among the job's agents (stable for its life)
  int agent_pid = 0;
  // agent state: rendezvous, running, restarting, stopping, succeeded, failed, stopped
  std::string state = "rendezvous";
  int round = -1;       // rendezvous round number (-1: none formed yet)
  int group_rank = -1;  // this node's rank in the round
  int group_world_size = 0;
  int world_size = 0;
  int restart_count = 0;
  int max_restarts = 0;
  double started_unix = 0;
  double updated_unix = 0;
  double interval_s = 1;  // how often this record is published
  std::uint64_t seq = 0;  // increases with every publication
  std::vector<RankStatus> ranks;
  std::vector<RestartEvent> restarts;            // the last kMaxEvents
  std::map<std::string, int> failures_by_cause;  // over the whole job, as this node saw them
  std::vector<Phase> phases;                     // the last kMaxEvents
  // The rendezvous store's outages as this agent saw them (docs/rendezvous.md): how many, how
  // long together, and how long the current one has lasted (-1: the store is there).
  int store_outages = 0;
  double store_outage_s = 0;
  double store_away_s = -1;
  // In-place heals of this node's workers (issue 34): how many, the last one's rank and how
  // long each took together (a worker's death to its replacement's first step).
  int heals = 0;
  double heal_s = 0;
  std::string last_heal;  // "rank 1: Signal 9 (SIGKILL), healed in 0.8 s"
  // The node's metrics over the run (metric_history.hpp's combine of its ranks' histories): at
  // most kRecordPoints points per metric. history_bytes: the memory the agent's per-rank
  // histories take (bounded: metric_history.hpp).
  Series history;
  std::uint64_t history_bytes = 0;
  // Set by readers, not published: the record is older than 3 intervals + 2 s and not final.
  bool lost = false;
};

inline constexpr std::size_t kMaxEvents = 64;  // restarts and phases kept in a record

// The whole job as one reader saw it.
struct JobStatus {
  int schema = kSchemaVersion;
  std::string run_id;
  double now_unix = 0;
  std::vector<NodeStatus> nodes;  // by slot
  // Derived from the nodes (fill_derived): the newest round, its members, worker count.
  int round = -1;
  int members = 0;
  int ranks = 0;
  int restarts = 0;   // the highest restart_count of any node
  std::string state;  // running, rendezvous, restarting, succeeded, failed, stopped, mixed
  // The job as a whole (fill_derived, job_summary.cpp), over the current round's running (and
  // succeeded) ranks: the step of the slowest (-1: none reported), of total_steps; the summed
  // samples/s of the running ones; their metrics, throughput ones summed and the rest averaged
  // (a finished job keeps its last); the ETA at the running ones' median step time (-1:
  // unknown); the wall time since the first agent started, the part of it lost to restarts
  // (rendezvous after the first, restarts, heals) and the rest's share (goodput).
  std::int64_t step = -1;
  std::int64_t total_steps = -1;
  double samples_per_s = 0;
  std::map<std::string, double> metrics;
  double eta_s = -1;
  double wall_s = 0;
  double lost_s = 0;
  double goodput = 1;
};
void fill_summary(JobStatus& job);  // the fields above, from the nodes

bool final_state(const std::string& node_state);  // succeeded, failed, stopped
// Marks lost nodes (at `now_unix`) and fills JobStatus's derived fields.
void fill_derived(JobStatus& job);

std::string to_json(const Series& s);              // {"loss": [[step, time, value], ...]}
Series series_from_json(const std::string& text);  // throws ddp::ProtocolError naming the field
// history false: the record as published (job_view.hpp: the history has a key of its own).
std::string to_json(const NodeStatus& n,
                    bool history = true);  // compact; a few hundred bytes per rank
// Throws ddp::ProtocolError naming the field. history false: the node's history is skipped.
NodeStatus node_from_json(const std::string& text, bool history = true);
// history false: the nodes' histories left out (/api/status; /api/history has them).
std::string to_json(const JobStatus& j, int indent = -1, bool history = true);
JobStatus job_from_json(const std::string& text);  // throws ddp::ProtocolError

}  // namespace ddp::status
