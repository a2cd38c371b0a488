// The ddprun rendezvous over any TCPStore (a ddprund, or the store an agent hosts): numbered
// rounds of MIN..MAX nodes, each sealed once (when MAX joined, when the expected number
// rejoined, or when MIN joined and the last call passed) and ended by exactly one RoundEvent,
// which every node watches with a server-side WAIT (no polling). Every agent makes O(1) store
// operations per round whatever the number of nodes (one MULTI_GET reads the others'
// descriptions). The algorithm and key layout are in docs/rendezvous.md.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/launch/round.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/store.hpp"

namespace ddp::launch {

struct RendezvousOptions {
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  bool by_node_rank = false;  // static backend: group rank = --node-rank
  std::chrono::milliseconds join_timeout{600000};
  std::chrono::milliseconds last_call{30000};  // after MIN joined, how long to wait for more
  // While fewer than MIN nodes have joined: every `notice_every`, on_wait gets a line saying how
  // many joined, where (`where`: the store's HOST:PORT or the etcd cluster) and what to check.
  std::string where{};
  std::chrono::milliseconds notice_every{30000};
  std::function<void(const std::string&)> on_wait{};
};

// What every node must share to meet in one round, in the words of the backend in use.
std::string join_hint(bool static_backend);

// A spare (a node beyond MAX) saw the job finish without needing it.
struct SpareNotNeeded {};

// The store came back without what this node wrote for the round it is forming (a ddprund
// restarted without --data-dir): next_round joins that round again.
struct StoreStateLost {};

// What this node wrote to the store for its current round, so that it can write it again when
// the store comes back empty (Rendezvous::republish). Thread-safe: the agent's loop updates
// it, the watcher's reconnection reads it.
class RoundClaims {
 public:
  struct Claims {
    int round = -1;      // -1: not in a round
    int arrival = 0;     // k: P/r<n>/node/<k>
    int members = 0;     // the sealed size; 0 while the round forms
    std::string node;    // this node's description, as written
    std::string master;  // "addr:port", when this node published the workers' store
    bool finished = false;
    std::string host;
    int group_rank = 0;
  };
  Claims get() const;
  void forming(int round, int arrival, std::string node);
  void formed(int members, int group_rank, std::string host);
  void master(std::string addr_port);
  void finished();
  std::mutex& republishing() { return republish_mu_; }

 private:
  mutable std::mutex mu_;
  std::mutex republish_mu_;
  Claims c_;
};

// What a formed round tells this node.
struct Round {
  int number = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int restart_count = 0;
  int base_global_rank = 0;
  int world_size = 1;
  int base_role_rank = 0;
  int role_world_size = 1;
  int arrival = 0;  // this node's arrival number k in the round
};

class Rendezvous {
 public:
  // Any Store: a StoreClient in the agent, a MemoryStore in tests.
  Rendezvous(rdzv::Store& store, RendezvousOptions options);

  // Joins round `hint` (or the job's current round when hint < 0) and blocks until it has
  // formed. `expect` (0: unknown) is how many nodes this node expects in the round; the one
  // that makes it so seals the round without waiting for the last call. `on_join(n)` runs
  // before this node joins round n (the agent points its liveness will at that round).
  // Throws ddp::TimeoutError after join_timeout, ddp::ConfigError when the run id has already
  // finished or a static node rank is taken twice, SpareNotNeeded when this node waited as a
  // spare and the job finished.
  Round next_round(const NodeDesc& self, int hint = -1, int expect = 0,
                   const std::function<void(int)>& on_join = {});

  // The workers' store of a round, published by group rank 0 and read by the others.
  void publish_master(const Round& round, const std::string& addr, std::uint16_t port);
  // The descriptions of the round's members (one MULTI_GET): the workers' store's host admits
  // their workers by these nodes' addresses.
  std::vector<NodeDesc> members(const Round& round);
  std::pair<std::string, std::uint16_t> master(const Round& round);

  // Posts `event` as the round's outcome unless another was posted first; returns the one
  // that holds. A failure or signal that leaves restarts opens the next round.
  RoundEvent end_round(const Round& round, const RoundEvent& event, bool reopen);

  // This node's workers all succeeded; the last node to finish posts "done".
  void finished(const Round& round, const std::string& host, int group_rank);

  // The store host must outlive the other agents' last request: each agent says it is
  // leaving; the host waits (bounded) until all have.
  void leave(const Round& round);
  void wait_all_left(const Round& round, std::chrono::milliseconds timeout);

  // On a new connection after an outage: when the store lost this node's part of its round
  // (restarted without --data-dir), writes it again (the round counter, the seal, this node's
  // description, the workers' store, its finish) so that the running round goes on and the
  // next one forms; throws StoreStateLost while the round is still forming. Returns whether
  // anything was written. Safe from any thread, over any connection `s`.
  bool republish(rdzv::Store& s);
  RoundClaims& claims() { return *claims_; }

  // The job's in-place heals, one counter for every round (lifecycle's count_heals).
  int count_heals(int add);
  // Regrouping: each node of `round` says whether it carries running workers into it; once
  // every node has said (within `timeout`), the round regroups around them when any does.
  // Returns how many nodes carry workers (0: no regroup; also on a timeout, a node that never
  // says: the round restarts its workers as before).
  int agree_regroup(const Round& round, bool carry, std::chrono::milliseconds timeout);

  std::string event_key(const Round& round) const;
  std::string event_key(int round) const;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string key(int round, const std::string& name) const;
  RoundEvent end_round_number(int round, const RoundEvent& event, bool reopen);
  std::pair<std::vector<std::string>, std::vector<std::string>> assignments(
      int round, int members, std::chrono::steady_clock::time_point give_up);
  // Waits for round r's event as a spare; returns the round to join next.
  int wait_as_spare(int r, std::chrono::steady_clock::time_point give_up);
  // Waits for round r's seal while fewer than MIN joined: on_wait's line every notice_every;
  // TimeoutError at give_up, naming the count, the store and join_hint(). Returns the seal.
  std::string wait_for_min(const std::string& seal_key, int r,
                           std::chrono::steady_clock::time_point start,
                           std::chrono::steady_clock::time_point give_up);
  [[noreturn]] void throw_finished() const;

  Round join_round(const NodeDesc& self, int& r, int& expect,
                   std::chrono::steady_clock::time_point start,
                   std::chrono::steady_clock::time_point give_up,
                   const std::function<void(int)>& on_join);

  rdzv::Store& store_;
  RendezvousOptions opts_;
  std::string prefix_;
  std::shared_ptr<RoundClaims> claims_ = std::make_shared<RoundClaims>();
};

// Watches one round's event key on a connection of its own (the WAIT blocks it) and makes an
// eventfd readable when the event is posted or the store is lost, so the agent can poll it
// together with its workers' pidfds and its signalfd.
class EventWatcher {
 public:
  EventWatcher(const std::string& host, std::uint16_t port, std::string key,
               rdzv::ClientOptions options = {});
  // Over any Store whose blocking calls `interrupt` ends (etcd: a watch stream).
  // `slice`: how long one WAIT request lasts before it is renewed (a store that stopped
  // answering is noticed at the renewal).
  EventWatcher(std::unique_ptr<rdzv::Store> store, std::function<void()> interrupt, std::string key,
               std::chrono::milliseconds slice = std::chrono::hours(24));
  ~EventWatcher();  // interrupts the WAIT and joins
  EventWatcher(const EventWatcher&) = delete;
  EventWatcher& operator=(const EventWatcher&) = delete;

  int fd() const { return efd_; }
  // After fd() became readable: the event, or nullopt with error() saying why the watch ended.
  std::optional<RoundEvent> event() const;
  std::string error() const;

 private:
  void run(std::string key);
  std::unique_ptr<rdzv::Store> store_;
  std::function<void()> interrupt_;
  int efd_ = -1;
  mutable std::mutex mu_;
  std::optional<RoundEvent> event_;
  std::string error_;
  std::thread thread_;
  std::chrono::milliseconds slice_{std::chrono::hours(24)};
};

}  // namespace ddp::launch
