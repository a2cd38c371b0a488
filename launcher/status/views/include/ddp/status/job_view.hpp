// Where the status records live in the rendezvous store, and how they are written and read
// with O(1) store operations: a node publishes with one SET per interval; a reader gets the
// whole job with three requests (CHECK, GET of the index, one MULTI_GET), whatever its size.
// Keys start with '/' because torch's TCPStore client puts one in front of every key: a Python
// client names them without it (store.get("ddprun/status/runs")).
//   /ddprun/status/runs                 run ids, one per line (APPENDed by each run's first agent)
//   /ddprun/status/<run>/slots          ADD counter: each agent takes a slot once
//   /ddprun/status/<run>/index          "<slot>," APPENDed after the slot's first record
//   /ddprun/status/<run>/node/<slot>    the node's record (record.hpp), SET every interval
//   /ddprun/status/<run>/history/<slot> its metric history (record.hpp's Series), SET before
//                                       the record every kHistoryEvery intervals and at the end
//   /ddprun/status/<run>/trace/<slot>   the node's trace events, SET once at exit (trace.hpp)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/status/record.hpp"

namespace ddp::rdzv {
class Store;
}

namespace ddp::status {

std::string runs_key();
std::string node_key(const std::string& run_id, int slot);
std::string trace_key(const std::string& run_id, int slot);
std::string history_key(const std::string& run_id, int slot);
inline constexpr std::uint64_t kHistoryEvery = 5;  // publications between history SETs

// Takes this agent's slot and publishes its first record (sets n.slot): ADD, SET, APPEND, and
// for the run's first agent one more APPEND to the run list.
void join(rdzv::Store& store, NodeStatus& n);
// One SET of the record without its history (bumps n.seq and n.updated_unix first), and one of
// the history before it every kHistoryEvery publications, in a final state, or when asked.
void publish(rdzv::Store& store, NodeStatus& n, double now_unix, bool history = false);
// After a lost connection: publishes again, and takes the slot again if the store lost it.
void rejoin(rdzv::Store& store, NodeStatus& n);

// The slots in an index value ("0,3,1,"); bad entries are skipped, duplicates dropped.
std::vector<int> parse_index(const std::string& text);
// The run ids of a run list, oldest first, at most `max` of the newest.
std::vector<std::string> parse_runs(const std::string& text, std::size_t max);

// The whole job (empty nodes when the run is unknown); lost nodes marked, derived fields filled.
// history: the nodes' metric histories too (one CHECK each and a MULTI_GET).
JobStatus read_job(rdzv::Store& store, const std::string& run_id, double now_unix,
                   bool history = false);
// The runs this store has seen, oldest first (the newest `max`).
std::vector<std::string> list_runs(rdzv::Store& store, std::size_t max = 64);

double unix_now();

}  // namespace ddp::status
