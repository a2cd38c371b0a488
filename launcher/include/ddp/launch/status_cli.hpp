// `ddprun status`: the job's nodes and ranks from the rendezvous store, as a table, refreshed
// in place (--watch) or as the versioned JSON of docs/status.schema.json (--json).
#pragma once

#include <string>
#include <vector>

#include "ddp/status/record.hpp"

namespace ddp::launch {

// argv after "status"; returns the exit code (0; 2 for bad flags; 1 when the store cannot be
// reached or the run is unknown).
int run_status_command(const std::vector<std::string>& args);

// The table for one look at the job (pure).
std::string format_status_table(const status::JobStatus& job);

}  // namespace ddp::launch
