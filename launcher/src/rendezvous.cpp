// The round protocol of rendezvous.hpp. Keys, under P = /ddprun/<run_id>:
//   P/round              ADD counter: the job's current round (bumped by the round's ender)
//   P/r<n>/joined        ADD: arrival number k; k > nnodes means the round is full
//   P/r<n>/node/<k>      SET: the k-th node's NodeDesc (JSON)
//   P/r<n>/noderank/<i>  ADD: static backend, catches two agents with one --node-rank
//   P/r<n>/ready         ADD: descriptions written; the nnodes-th sets P/r<n>/complete
//   P/r<n>/complete      the round formed
//   P/r<n>/master        "addr:port" of the workers' store (group rank 0 hosts it)
//   P/r<n>/event         COMPARE_SET from absent: the round's one outcome (RoundEvent JSON)
//   P/r<n>/finished      ADD: nodes whose workers all succeeded; the last posts "done"
//   P/r<n>/left, gone    ADD/SET: agents that no longer need the store
// Per agent and round: ADD round, ADD joined, SET node, ADD ready, WAIT complete, MULTI_GET
// nodes, one read or write of master, and one event write or watch: O(1) in the node count.
#include "ddp/launch/rendezvous.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/proto/error.hpp"

namespace ddp::launch {

using std::chrono::milliseconds;

Rendezvous::Rendezvous(rdzv::StoreClient& store, RendezvousOptions options)
    : store_(store), opts_(std::move(options)), prefix_("/ddprun/" + opts_.run_id) {}

std::string Rendezvous::key(int round, const std::string& name) const {
  return prefix_ + "/r" + std::to_string(round) + "/" + name;
}

std::string Rendezvous::event_key(const Round& round) const { return key(round.number, "event"); }

Round Rendezvous::next_round(const NodeDesc& self, int hint) {
  const auto give_up = std::chrono::steady_clock::now() + opts_.join_timeout;
  auto left = [&] {
    auto d = std::chrono::duration_cast<milliseconds>(give_up - std::chrono::steady_clock::now());
    return std::max(d, milliseconds(1));
  };
  int r = hint >= 0 ? hint : static_cast<int>(store_.add(prefix_ + "/round", 0));
  while (true) {
    const auto k = store_.add(key(r, "joined"), 1);
    if (k > opts_.nnodes) {
      // Full: a spare until the round ends. A finished round means the run id is used up.
      std::string ev;
      try {
        store_.wait({key(r, "event")}, left());
        ev = store_.get(key(r, "event"));
      } catch (const TimeoutError&) {
        throw TimeoutError("rendezvous '" + opts_.run_id + "': round " + std::to_string(r) +
                           " already has its " + std::to_string(opts_.nnodes) +
                           " nodes and did not end within the join timeout; is another job "
                           "using this --rdzv-id?");
      }
      RoundEvent e = decode_event(ev);
      if (e.kind == RoundEvent::Kind::done) {
        throw ConfigError("rendezvous '" + opts_.run_id +
                          "' belongs to a job that already "
                          "finished; choose another --rdzv-id (under Slurm, the job id is a "
                          "good one) or start a new store");
      }
      r = static_cast<int>(store_.add(prefix_ + "/round", 0));
      if (r <= static_cast<int>(k)) r = std::max(r, 0);
      continue;
    }
    if (opts_.by_node_rank) {
      auto claims = store_.add(key(r, "noderank/" + std::to_string(self.node_rank)), 1);
      if (claims > 1) {
        throw ConfigError("--node-rank=" + std::to_string(self.node_rank) +
                          " is already taken by another agent of rendezvous '" + opts_.run_id +
                          "'; give every node a distinct --node-rank in 0.." +
                          std::to_string(opts_.nnodes - 1));
      }
    }
    store_.set(key(r, "node/" + std::to_string(k)), encode(self));
    if (store_.add(key(r, "ready"), 1) == opts_.nnodes) store_.set(key(r, "complete"), "1");
    try {
      store_.wait({key(r, "complete")}, left());
    } catch (const TimeoutError&) {
      throw TimeoutError("rendezvous '" + opts_.run_id + "': only " +
                         std::to_string(store_.add(key(r, "ready"), 0)) + " of " +
                         std::to_string(opts_.nnodes) + " nodes joined round " + std::to_string(r) +
                         " within the join timeout (" +
                         std::to_string(opts_.join_timeout.count() / 1000) +
                         " s); check that every node runs ddprun with the same --rdzv-endpoint "
                         "and --rdzv-id");
    }
    std::vector<std::string> keys;
    for (int i = 1; i <= opts_.nnodes; ++i) keys.push_back(key(r, "node/" + std::to_string(i)));
    std::vector<NodeDesc> nodes;
    for (const auto& text : store_.multi_get(keys)) nodes.push_back(decode_node(text));

    Round round;
    round.number = r;
    round.group_world_size = opts_.nnodes;
    round.restart_count = round_restart_count(nodes);
    for (int i : group_rank_order(nodes, opts_.by_node_rank)) {
      if (static_cast<std::int64_t>(i + 1) == k) {
        round.group_rank = static_cast<int>(round.nodes.size());
      }
      round.nodes.push_back(nodes[static_cast<std::size_t>(i)]);
    }
    return round;
  }
}

void Rendezvous::publish_master(const Round& round, const std::string& addr, std::uint16_t port) {
  store_.set(key(round.number, "master"), addr + ":" + std::to_string(port));
}

std::pair<std::string, std::uint16_t> Rendezvous::master(const Round& round) {
  store_.wait({key(round.number, "master")}, opts_.join_timeout);
  std::string v = store_.get(key(round.number, "master"));
  auto colon = v.rfind(':');
  if (colon == std::string::npos) throw ProtocolError("bad master address in the store: " + v);
  return {v.substr(0, colon), static_cast<std::uint16_t>(std::stoi(v.substr(colon + 1)))};
}

RoundEvent Rendezvous::end_round(const Round& round, const RoundEvent& event, bool reopen) {
  std::string mine = encode(event);
  std::string held = store_.compare_set(event_key(round), "", mine);
  if (held != mine) return decode_event(held);
  // This node ended the round: it opens the next one for agents that start afresh.
  if (reopen) store_.add(prefix_ + "/round", 1);
  return event;
}

void Rendezvous::finished(const Round& round, const std::string& host, int group_rank) {
  if (store_.add(key(round.number, "finished"), 1) == round.group_world_size) {
    RoundEvent done;
    done.kind = RoundEvent::Kind::done;
    done.host = host;
    done.group_rank = group_rank;
    end_round(round, done, /*reopen=*/false);
  }
}

void Rendezvous::leave(const Round& round) {
  if (store_.add(key(round.number, "left"), 1) == round.group_world_size) {
    store_.set(key(round.number, "gone"), "1");
  }
}

void Rendezvous::wait_all_left(const Round& round, milliseconds timeout) {
  try {
    store_.wait({key(round.number, "gone")}, timeout);
  } catch (const TimeoutError&) {
    // An agent that died after the job finished; nothing is lost by not waiting for it.
  }
}

EventWatcher::EventWatcher(const std::string& host, std::uint16_t port, std::string key) {
  efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd_ < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
  try {
    client_ = std::make_unique<rdzv::StoreClient>(host, port);
  } catch (...) {
    ::close(efd_);
    throw;
  }
  thread_ = std::thread([this, k = std::move(key)] { run(k); });
}

EventWatcher::~EventWatcher() {
  client_->interrupt();
  thread_.join();
  ::close(efd_);
}

std::optional<RoundEvent> EventWatcher::event() const {
  std::lock_guard<std::mutex> g(mu_);
  return event_;
}

std::string EventWatcher::error() const {
  std::lock_guard<std::mutex> g(mu_);
  return error_;
}

void EventWatcher::run(std::string key) {
  std::optional<RoundEvent> ev;
  std::string err;
  try {
    // A server-side WAIT: the store answers the moment the event is posted. The timeout only
    // bounds one request; the loop renews it.
    while (true) {
      try {
        client_->wait({key}, std::chrono::hours(24));
        break;
      } catch (const TimeoutError&) {
      }
    }
    ev = decode_event(client_->get(key));
  } catch (const std::exception& e) {
    err = e.what();
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    event_ = std::move(ev);
    error_ = std::move(err);
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(efd_, &one, sizeof(one));
}

}  // namespace ddp::launch
