// A worker's place in its group across heals and regroups (see membership.hpp).
#include "ddp/worker/membership.hpp"

#include <chrono>
#include <iostream>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/progress.hpp"

namespace ddp::worker {

std::string generation_prefix(const std::string& base, int g) {
  return g == 0 ? base : base + "/g" + std::to_string(g);
}

Membership::Membership(MembershipConfig c) : c_(std::move(c)) {
  if (!c_.make_device) c_.make_device = make_nccl_communicator;
  store_ = std::make_unique<WorkerStore>(c_.env);
  c_.comm.rank = c_.env.rank;
  c_.comm.size = c_.env.world_size;
  c_.comm.store = store_->client();
  c_.comm.route_towards = c_.env.master_addr;
  base_ = c_.env.store_prefix() + "/" + c_.name;
  if (c_.join_round >= 0 && c_.in_place) {  // a node that joins: the running ranks' group
    base_ += "/r" + std::to_string(c_.join_round);
    regrouped_ = true;
  }
}

Membership::~Membership() {
  device_.reset();  // NCCL before the store its id came through
  comm_.reset();
}

std::string Membership::member_key(int g, int rank) const {
  return base_ + "/member/" + std::to_string(g) + "/" + std::to_string(rank);
}

std::string Membership::joined_key(int round) const {
  return c_.env.store_prefix() + "/" + c_.name + "/r" + std::to_string(round) + "/joined";
}

void Membership::skip_joined_generations() {
  while (c_.comm.store->check({member_key(gen_, c_.env.rank)})) ++gen_;
}

bool Membership::read_control() {
  if (!c_.in_place || c_.progress == nullptr) return regroup_.has_value();
  while (auto line = c_.progress->take_line()) {
    try {
      if (agent_line_kind(*line) == "peer_lost") {
        const PeerLost p = parse_peer_lost(*line);
        peer_lost_ = true;
        std::cerr << tag() << ": rank " << p.rank << " was lost (heal " << p.heal << ")\n";
      } else {
        Regroup r = parse_regroup(*line);
        if (!c_.regroups) throw ConfigError("a regroup line, but this worker did not declare one");
        regroup_ = std::move(r);
      }
    } catch (const ConfigError& e) {
      std::cerr << tag() << ": warning: a line from the agent: " << e.what() << "; ignored\n";
    }
  }
  return regroup_.has_value();
}

// The regroup line's place: new rank, world and store; the group's communicators start again
// at generation 0 under r<round>.
void Membership::apply_regroup() {
  const Regroup r = *std::exchange(regroup_, std::nullopt);
  WorkerEnv& w = c_.env;
  std::cerr << tag() << ": regrouping (round " << r.round << "): rank " << r.rank << " of "
            << r.world << " (was " << w.rank << " of " << w.world_size << ")\n"
            << std::flush;
  const bool moved = r.master_addr != w.master_addr || r.master_port != w.master_port;
  w.rank = r.rank;
  w.world_size = r.world;
  w.local_rank = r.local_rank;
  w.local_world_size = r.local_world;
  w.group_rank = r.group_rank;
  w.group_world_size = r.group_world;
  w.master_addr = r.master_addr;
  w.master_port = r.master_port;
  if (moved) {  // the new group's store (the old one may be gone with its node)
    store_ = std::make_unique<WorkerStore>(w);
    c_.comm.store = store_->client();
  }
  c_.comm.rank = r.rank;
  c_.comm.size = r.world;
  c_.comm.route_towards = r.master_addr;
  base_ = w.store_prefix() + "/" + c_.name + "/r" + std::to_string(r.round);
  gen_ = 0;
  regrouped_ = true;
}

// Generation g (a heal's g > 0, or a regroup's 0) forms once every rank marked it. A stop
// signal while waiting (the agent restarting the job instead) ends the wait, so the rank can
// save and stop; a regroup line ends it too (false).
bool Membership::wait_for_members(int g) {
  std::vector<std::string> keys;
  for (int r = 0; r < c_.env.world_size; ++r) keys.push_back(member_key(g, r));
  const auto deadline = std::chrono::steady_clock::now() + c_.comm.timeout;
  const std::string gen_name = "generation " + std::to_string(g);
  const auto all_came = [&] {
    try {
      return c_.comm.store->check(keys);
    } catch (const Error&) {
      if (!c_.regroups) throw;
      return false;  // the store went with its node: a regroup line names the next one
    }
  };
  while (!all_came()) {
    if (c_.stop_signal != nullptr && c_.stop_signal->load() != 0) {
      throw IoError("in-place recovery: a stop signal while waiting for the ranks of " + gen_name);
    }
    if (read_control() && c_.regroups) return false;
    if (std::chrono::steady_clock::now() > deadline) {
      throw IoError("in-place recovery: the ranks of " + gen_name + " did not all come");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// This rank's mark for generation g; a joiner also counts itself ready, once (the running ranks
// train on until every joiner did).
void Membership::mark(int g) {
  try {
    c_.comm.store->set(member_key(g, c_.env.rank), "1");
    if (c_.join_round >= 0 && c_.regroups && !counted_) {
      c_.comm.store->add(joined_key(c_.join_round), 1);
      counted_ = true;
    }
  } catch (const Error&) {
    if (!c_.regroups || (g == 0 && !regrouped_)) throw;  // else as in wait_for_members
  }
}

Communicator* Membership::connect() {
  comm_.reset();  // first: its sockets close, and peers still blocked on them fail too
  if (c_.in_place) {
    read_control();
    while (true) {
      if (regroup_) apply_regroup();
      mark(gen_);
      if ((gen_ == 0 && !regrouped_) || wait_for_members(gen_)) break;
    }
    read_control();
    peer_lost_ = false;  // every member came: the losses said so far are healed
  }
  CommOptions co = c_.comm;
  co.key_prefix = generation_prefix(base_, gen_) + "/gloo";
  comm_ = make_gloo_communicator(co);
  if (c_.env.local_world_size == c_.env.world_size && c_.shm_allreduce) {
    comm_ = make_local_communicator(std::move(comm_), co);
  }
  return comm_.get();
}

Communicator* Membership::connect_device(int device) {
  device_.reset();
  CommOptions co = c_.comm;
  co.key_prefix = generation_prefix(base_, gen_) + "/nccl";
  if (c_.in_place) {  // a dead peer on this node: NCCL would wait for it until the timeout
    co.interrupted = [this] {
      read_control();
      return peer_lost_;
    };
  }
  device_ = c_.make_device(co, device);
  return device_.get();
}

bool Membership::regroup_pending() {
  if (!read_control()) return false;
  const Regroup& r = *regroup_;
  if (r.joining == 0) return true;
  try {
    const std::string at = r.master_addr + ":" + std::to_string(r.master_port);
    if (!peek_ || peek_at_ != at) {
      WorkerEnv there = c_.env;
      there.master_addr = r.master_addr;
      there.master_port = r.master_port;
      peek_ = std::make_unique<WorkerStore>(there);
      peek_at_ = at;
    }
    return peek_->client()->add(joined_key(r.round), 0) >= r.joining;
  } catch (const Error&) {
    return true;  // cannot tell: regroup now, and wait for them there
  }
}

}  // namespace ddp::worker
