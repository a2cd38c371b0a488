// `ddprun status`: the job's nodes and ranks from the rendezvous store, as a table, refreshed
// in place (--watch) or as the versioned JSON of docs/status.schema.json (--json).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/rdzv/endpoint.hpp"
#include "ddp/rdzv/store.hpp"
#include "ddp/status/record.hpp"

namespace ddp::launch {

struct StatusOptions {
  rdzv::Endpoint endpoint;       // --rdzv-endpoint HOST[:PORT] (port 29400 when left out; c10d)
  std::string backend = "c10d";  // --rdzv-backend: c10d or etcd-v3
  std::string members;           // etcd-v3: --rdzv-endpoint as given
  std::map<std::string, std::string> rdzv_conf;  // --rdzv-conf (etcd-v3: key_prefix, user...)
  std::string run_id;     // --run-id / --rdzv-id; "": the newest run the store has seen
  bool watch = false;     // refresh every interval_s until SIGINT/SIGTERM
  double interval_s = 1;  // --interval, 0.1..3600
  bool json = false;      // to_json(JobStatus) instead of the table
  bool help = false;      // --help / -h: print status_usage() and exit 0
};

// Pure: argv after "status". Throws ddp::UsageError naming the bad flag.
StatusOptions parse_status_args(const std::vector<std::string>& args);
std::string status_usage();

// Opens the etcd-v3 cluster of `o` (the agent's side knows the backend's settings): a
// ddp::ConfigError for a bad --rdzv-conf.
using EtcdStatusStore = std::function<std::unique_ptr<rdzv::Store>(const StatusOptions& o)>;

// argv after "status"; returns the exit code (0; 2 for bad flags; 1 when the store cannot be
// reached or the run is unknown).
int run_status_command(const std::vector<std::string>& args, const EtcdStatusStore& etcd = {});

// The table for one look at the job (pure): a header line, then one row per rank grouped by
// node, columns aligned, every line ending in '\n'.
std::string format_status_table(const status::JobStatus& job);

}  // namespace ddp::launch
