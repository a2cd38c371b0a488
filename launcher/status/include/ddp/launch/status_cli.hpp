// `ddprun status`: the job's nodes and ranks from the rendezvous store, as a table, refreshed
// in place (--watch) or as the versioned JSON of docs/status.schema.json (--json).
#pragma once

#include <string>
#include <vector>

#include "ddp/rdzv/endpoint.hpp"
#include "ddp/status/record.hpp"

namespace ddp::launch {

struct StatusOptions {
  rdzv::Endpoint endpoint;  // --rdzv-endpoint HOST[:PORT] (port 29400 when left out)
  std::string run_id;       // --run-id / --rdzv-id; "": the newest run the store has seen
  bool watch = false;       // refresh every interval_s until SIGINT/SIGTERM
  double interval_s = 1;    // --interval, 0.1..3600
  bool json = false;        // to_json(JobStatus) instead of the table
  bool help = false;        // --help / -h: print status_usage() and exit 0
};

// Pure: argv after "status". Throws ddp::UsageError naming the bad flag.
StatusOptions parse_status_args(const std::vector<std::string>& args);
std::string status_usage();

// argv after "status"; returns the exit code (0; 2 for bad flags; 1 when the store cannot be
// reached or the run is unknown).
int run_status_command(const std::vector<std::string>& args);

// The table for one look at the job (pure): a header line, then one row per rank grouped by
// node, columns aligned, every line ending in '\n'.
std::string format_status_table(const status::JobStatus& job);

}  // namespace ddp::launch
