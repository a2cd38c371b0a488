// A worker's place in its group across in-place heals and elastic regroups (docs/worker_runtime.md,
// "In-place recovery" and "Regrouping"): which generation of communicators it is in, the marks
// every member leaves in the job's store before a generation forms, and the agent's regroup lines
// (ddp/proto/regroup.hpp) that move it into a new group. ddp-train's main() owns one; any C++
// worker can.
//
// Names in the store, under the worker's store prefix P (WorkerEnv::store_prefix()) and a name
// N ("ddp_train" for ddp-train):
//   P/N                    generation 0's communicators (gloo, shm, nccl under it)
//   P/N/g<g>               generation g > 0: after the g-th heal this member took part in
//   P/N/member/<g>/<rank>  rank's mark that it joins generation g
//   P/N/r<round>           a regroup's group (round: the agents' rendezvous round), from
//                          generation 0 again, with the same layout below it
//   P/N/r<round>/joined    the count of joining ranks ready (a node that joins)
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/proto/regroup.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/env.hpp"

namespace ddp::worker {

class ProgressWriter;

// The key prefix of generation g's communicators under `base` (pure).
std::string generation_prefix(const std::string& base, int g);

struct MembershipConfig {
  WorkerEnv env;     // RANK, WORLD_SIZE, MASTER_*: where the group's store is
  CommOptions comm;  // timeout, iface, ...: rank, size, store and key_prefix are set here
  std::string name = "ddp_train";
  bool in_place = false;      // a dead peer is replaced: generations g > 0
  bool regroups = false;      // regroup lines are heard on the progress writer's control pipe
  int join_round = -1;        // DDPRUN_JOIN_ROUND: joins the running group of that round
  bool shm_allreduce = true;  // every rank on one host: shared memory in front of gloo
  ProgressWriter* progress = nullptr;             // the control pipe (regroups)
  const std::atomic<int>* stop_signal = nullptr;  // a stop ends a wait for members
  // The device communicator of a generation (NCCL); default make_nccl_communicator.
  std::function<std::unique_ptr<Communicator>(const CommOptions&, int device)> make_device;
};

class Membership {
 public:
  // Opens the job's store (WorkerStore: the agent's, or hosted by rank 0).
  explicit Membership(MembershipConfig c);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // A replacement (DDPRUN_HEAL > 0): the generation after the last its rank joined.
  void skip_joined_generations();
  // The host communicator of the current generation (gloo, shm in front when every rank is on
  // this host); the previous one is closed first, so peers blocked on it fail too. In place,
  // every member's mark comes first (a regroup line read meanwhile moves this member, and it
  // connects there). Throws ddp::IoError on a stop signal or the timeout.
  Communicator* connect();
  // The next generation's (a heal).
  Communicator* reconnect() {
    ++gen_;
    return connect();
  }
  // The device communicator (NCCL) of the current generation, replacing the last one (aborted
  // by its failure): under generation_prefix(...) + "/nccl".
  Communicator* connect_device(int device);
  // True when a regroup line has come (reads the control pipe; never blocks). With joining
  // ranks, only once they counted themselves ready in the new group's store.
  bool regroup_pending();
  // The agent said a peer of this node died (a peer_lost line) since the last generation
  // formed: the device communicator's waits stop on it (CommOptions::interrupted).
  bool peer_lost() {
    read_control();
    return peer_lost_;
  }

  const WorkerEnv& env() const { return c_.env; }
  // Generation 0's prefix of this group (the mesh's and NCCL's communicators go under it).
  const std::string& base() const { return base_; }
  const CommOptions& options() const { return c_.comm; }
  Communicator* comm() const { return comm_.get(); }
  Communicator* device_comm() const { return device_.get(); }
  int generation() const { return gen_; }
  // "ddp-train rank <r>", the rank as of the last regroup.
  std::string tag() const { return "ddp-train rank " + std::to_string(c_.env.rank); }

 private:
  bool read_control();
  void apply_regroup();
  bool wait_for_members(int g);
  void mark(int g);
  std::string member_key(int g, int rank) const;
  std::string joined_key(int round) const;

  MembershipConfig c_;
  std::unique_ptr<WorkerStore> store_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> device_;
  std::string base_;
  int gen_ = 0;
  std::optional<Regroup> regroup_;     // read, not yet applied
  bool counted_ = false;               // a joiner counted itself in the new group's store
  bool regrouped_ = false;             // base_ is a regroup's group
  bool peer_lost_ = false;             // the agent said a peer died since the last generation
  std::unique_ptr<WorkerStore> peek_;  // the new group's store, before regrouping
  std::string peek_at_;
};

}  // namespace ddp::worker
