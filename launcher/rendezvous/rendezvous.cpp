// The round protocol of rendezvous.hpp (docs/rendezvous.md). Keys, under P = /ddprun/<run_id>:
//   P/round              ADD counter: the job's current round (bumped by the round's ender)
//   P/r<n>/joined        ADD: arrival number k; k > MAX (or > the sealed size) is not a member
//   P/r<n>/node/<k>      SET: the k-th node's NodeDesc (JSON)
//   P/r<n>/noderank/<i>  ADD: static backend, catches two agents with one --node-rank
//   P/r<n>/seal          COMPARE_SET from absent: the member count m; members are k = 1..m
//   P/r<n>/assign/<k>    MULTI_SET by the sealer: node k's ranks (Assignment JSON)
//   P/r<n>/master        "addr:port" of the workers' store (group rank 0 hosts it)
//   P/r<n>/event         COMPARE_SET from absent: the round's one outcome (RoundEvent JSON);
//                        also each agent's lease will ("lost") when it dies or goes silent
//   P/r<n>/finished      ADD: nodes whose workers all succeeded; the last posts "done"
//   P/r<n>/left, gone    ADD/SET: agents that no longer need the store
// Per agent and round: ADD round, ADD joined, SET node, WAIT + GET seal (the sealer: ADD, WAIT
// + MULTI_GET nodes, then COMPARE_SET seal + MULTI_SET assignments, one txn on etcd), GET its
// assignment: O(1) requests in the node count, and O(1) bytes except for the sealer's O(N).
#include "ddp/launch/rendezvous.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "ddp/proto/error.hpp"

namespace ddp::launch {

using std::chrono::milliseconds;

namespace {
// A number another agent wrote to the store; anything else is named, not a bare "stoi".
int stored_int(const std::string& key, const std::string& text, int lo, int hi) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
    throw ProtocolError("the store holds '" + text.substr(0, 100) + "' under " + key +
                        ", not a number in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return v;
}
}  // namespace

Rendezvous::Rendezvous(rdzv::Store& store, RendezvousOptions options)
    : store_(store), opts_(std::move(options)), prefix_("/ddprun/" + opts_.run_id) {}

std::string Rendezvous::key(int round, const std::string& name) const {
  return prefix_ + "/r" + std::to_string(round) + "/" + name;
}

std::string Rendezvous::event_key(const Round& round) const { return key(round.number, "event"); }
int Rendezvous::count_heals(int add) {
  return static_cast<int>(store_.add(prefix_ + "/heals", add));
}

int Rendezvous::agree_regroup(const Round& round, bool carry, std::chrono::milliseconds timeout) {
  const int r = round.number;
  const std::string carriers = key(r, "regroup_carriers");
  if (carry) store_.add(carriers, 1);  // before the vote: counted once every vote is in
  auto votes = store_.add(key(r, "regroup_votes"), 1);
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (votes < round.group_world_size) {
    if (std::chrono::steady_clock::now() > give_up) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    votes = store_.add(key(r, "regroup_votes"), 0);
  }
  return static_cast<int>(store_.add(carriers, 0));
}

std::string Rendezvous::event_key(int round) const { return key(round, "event"); }

std::string join_hint(bool static_backend) {
  return static_backend ? "check that every node runs ddprun with the same --nnodes, --master-addr "
                          "and --master-port, each with its own --node-rank"
                        : "check that every node runs ddprun with the same --nnodes, "
                          "--rdzv-endpoint and --rdzv-id";
}

std::string Rendezvous::wait_for_min(const std::string& seal_key, int r,
                                     std::chrono::steady_clock::time_point start,
                                     std::chrono::steady_clock::time_point give_up) {
  using Clock = std::chrono::steady_clock;
  const auto joined = [&] {
    return std::to_string(store_.add(key(r, "joined"), 0)) + " of at least " +
           std::to_string(opts_.min_nodes) + " nodes joined round " + std::to_string(r);
  };
  const std::string at = opts_.where.empty() ? "" : " at " + opts_.where;
  auto next_notice = Clock::now() + opts_.notice_every;
  while (true) {
    const auto now = Clock::now();
    const auto slice = opts_.on_wait ? std::min(give_up, next_notice) : give_up;
    try {
      return store_.wait_get(
          seal_key,
          std::max(std::chrono::duration_cast<milliseconds>(slice - now), milliseconds(1)));
    } catch (const TimeoutError&) {
      if (Clock::now() >= give_up || !opts_.on_wait) {
        throw TimeoutError("rendezvous '" + opts_.run_id + "'" + at + ": only " + joined() +
                           " within the join timeout (" +
                           std::to_string(opts_.join_timeout.count() / 1000) + " s); " +
                           join_hint(opts_.by_node_rank));
      }
      if (Clock::now() < next_notice) continue;  // the store's wait ended early
      next_notice += opts_.notice_every;
      const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
      opts_.on_wait("ddprun: waiting for nodes: " + joined() + at + " (" +
                    std::to_string(waited.count()) + " s of the " +
                    std::to_string(opts_.join_timeout.count() / 1000) + " s join timeout); " +
                    join_hint(opts_.by_node_rank));
    }
  }
}

Round Rendezvous::next_round(const NodeDesc& self, int hint, int expect,
                             const std::function<void(int)>& on_join) {
  const auto start = std::chrono::steady_clock::now();
  const auto give_up = start + opts_.join_timeout;
  int r = hint >= 0 ? hint : static_cast<int>(store_.add(prefix_ + "/round", 0));
  while (true) {
    try {
      return join_round(self, r, expect, start, give_up, on_join);
    } catch (const StoreStateLost&) {
      if (opts_.on_wait) {
        opts_.on_wait("ddprun: the rendezvous store came back without round " + std::to_string(r) +
                      " (restarted without --data-dir?); joining it again");
      }
      expect = 0;
    }
  }
}

// One attempt at round r (moving r on past rounds this node cannot be a member of).
Round Rendezvous::join_round(const NodeDesc& self, int& r, int& expect,
                             std::chrono::steady_clock::time_point start,
                             std::chrono::steady_clock::time_point give_up,
                             const std::function<void(int)>& on_join) {
  auto until = [](std::chrono::steady_clock::time_point t) {
    auto d = std::chrono::duration_cast<milliseconds>(t - std::chrono::steady_clock::now());
    return std::max(d, milliseconds(1));
  };
  while (true) {
    claims_->forming(r, 0, "");
    if (on_join) on_join(r);
    const auto k = store_.add(key(r, "joined"), 1);
    if (k > opts_.max_nodes) {
      r = wait_as_spare(r, give_up);
      expect = 0;
      continue;
    }
    if (opts_.by_node_rank) {
      auto claims = store_.add(key(r, "noderank/" + std::to_string(self.node_rank)), 1);
      if (claims > 1) {
        throw ConfigError("--node-rank=" + std::to_string(self.node_rank) +
                          " is already taken by another agent of rendezvous '" + opts_.run_id +
                          "'; give every node a distinct --node-rank in 0.." +
                          std::to_string(opts_.max_nodes - 1));
      }
    }
    const std::string described = encode(self);
    store_.set(key(r, "node/" + std::to_string(k)), described);
    claims_->forming(r, static_cast<int>(k), described);

    // Seal: MAX joined, or the number this node expects (a re-forming job), or MIN joined and
    // this node's last call passed. The sealer reads the members' descriptions and creates the
    // seal (the member count) with every assignment (create_with: one etcd txn); the first to
    // create it wins, and a node that sees the seal finds its assignment there.
    const std::string seal_key = key(r, "seal");
    auto seal_now = [&] {
      // The MAX-th arrival knows the count without asking: at least MAX joined, MAX are members.
      const auto m = k >= opts_.max_nodes
                         ? std::int64_t{opts_.max_nodes}
                         : std::min<std::int64_t>(store_.add(key(r, "joined"), 0), opts_.max_nodes);
      auto [akeys, values] = assignments(r, static_cast<int>(m), give_up);
      return store_.create_with(seal_key, std::to_string(m), akeys, values);
    };
    std::string sealed;
    if (k == opts_.max_nodes || (expect >= opts_.min_nodes && k == expect)) {
      sealed = seal_now();
    } else if (k >= opts_.min_nodes) {
      try {
        sealed = store_.wait_get(seal_key, std::min(opts_.last_call, until(give_up)));
      } catch (const TimeoutError&) {
        sealed = seal_now();  // the last call passed with at least MIN nodes
      }
    } else {
      sealed = wait_for_min(seal_key, r, start, give_up);
    }
    const int m = stored_int(seal_key, sealed, 1, opts_.max_nodes);
    if (k > m) {
      // Sealed just before this node: ask for a bigger round (scale up), or be a spare.
      if (m < opts_.max_nodes) {
        RoundEvent join;
        join.kind = RoundEvent::Kind::join;
        join.host = self.host;
        join.pid = self.pid;
        RoundEvent held = end_round_number(r, join, /*reopen=*/true);
        if (held.kind == RoundEvent::Kind::done) throw_finished();
        ++r;
        expect = 0;
        continue;
      }
      r = wait_as_spare(r, give_up);
      expect = 0;
      continue;
    }

    // Written by the sealer right after sealing (GET waits for it, within read_timeout).
    Assignment a = decode_assignment(store_.get(key(r, "assign/" + std::to_string(k))));
    if (a.abandoned) {
      // A member died before describing itself; its lease will ended the round. The others
      // form the next one at once.
      ++r;
      expect = m - 1;
      continue;
    }
    Round round;
    round.number = r;
    round.group_rank = a.group_rank;
    round.group_world_size = a.group_world_size;
    round.restart_count = a.restart_count;
    round.base_global_rank = a.base_global_rank;
    round.world_size = a.world_size;
    round.base_role_rank = a.base_role_rank;
    round.role_world_size = a.role_world_size;
    round.arrival = static_cast<int>(k);
    claims_->formed(m, a.group_rank, self.host);
    return round;
  }
}

// The sealer of round r (m members) reads every description once and computes each node's
// assignment (keys and values, written with the seal): O(m) bytes for this node, O(1) for every
// other.
std::pair<std::vector<std::string>, std::vector<std::string>> Rendezvous::assignments(
    int r, int m, std::chrono::steady_clock::time_point give_up) {
  std::vector<std::string> keys;
  for (int i = 1; i <= m; ++i) keys.push_back(key(r, "node/" + std::to_string(i)));
  std::vector<std::string> akeys;
  for (int i = 1; i <= m; ++i) akeys.push_back(key(r, "assign/" + std::to_string(i)));
  // Normally every description is there already (each is written right after its arrival
  // number). A member that died in between never writes one: its lease will posts the round's
  // event, and the round is abandoned instead of waiting for it.
  while (true) {
    try {
      store_.wait(keys, milliseconds(1000));
      break;
    } catch (const TimeoutError&) {
      if (store_.check({key(r, "event")})) {
        Assignment gone;
        gone.abandoned = true;
        return {akeys, std::vector<std::string>(akeys.size(), encode(gone))};
      }
      if (std::chrono::steady_clock::now() > give_up) {
        throw TimeoutError("rendezvous '" + opts_.run_id + "': round " + std::to_string(r) +
                           " sealed with " + std::to_string(m) +
                           " members, but not all described themselves within the join timeout");
      }
    }
  }
  std::vector<NodeDesc> nodes;
  for (const auto& text : store_.multi_get(keys)) nodes.push_back(decode_node(text));
  const auto assigned = assign_round(nodes, opts_.by_node_rank);
  std::vector<std::string> values;
  for (int i = 1; i <= m; ++i) values.push_back(encode(assigned[static_cast<std::size_t>(i - 1)]));
  return {akeys, values};
}

std::vector<NodeDesc> Rendezvous::members(const Round& round) {
  std::vector<std::string> keys;
  for (int k = 1; k <= round.group_world_size; ++k) {
    keys.push_back(key(round.number, "node/" + std::to_string(k)));
  }
  std::vector<NodeDesc> nodes;
  for (const auto& text : store_.multi_get(keys)) nodes.push_back(decode_node(text));
  return nodes;
}

int Rendezvous::wait_as_spare(int r, std::chrono::steady_clock::time_point give_up) {
  const std::string ev_key = key(r, "event");
  const bool ended_before = store_.check({ev_key});
  if (!ended_before) {
    // A spare: no timeout but the job's own end (torch's redundancy list). Renewed waits keep
    // each request bounded.
    while (true) {
      try {
        store_.wait({ev_key}, std::chrono::hours(1));
        break;
      } catch (const TimeoutError&) {
      }
    }
  }
  (void)give_up;
  RoundEvent e = decode_event(store_.get(ev_key));
  if (e.kind == RoundEvent::Kind::done) {
    if (ended_before) throw_finished();
    throw SpareNotNeeded{};
  }
  return static_cast<int>(std::max<std::int64_t>(store_.add(prefix_ + "/round", 0), r + 1));
}

[[noreturn]] void Rendezvous::throw_finished() const {
  throw ConfigError("rendezvous '" + opts_.run_id +
                    "' belongs to a job that already finished; choose another --rdzv-id "
                    "(under Slurm, the job id is a good one) or start a new store");
}

void Rendezvous::publish_master(const Round& round, const std::string& addr, std::uint16_t port) {
  store_.set(key(round.number, "master"), addr + ":" + std::to_string(port));
  claims_->master(addr + ":" + std::to_string(port));
}

std::pair<std::string, std::uint16_t> Rendezvous::master(const Round& round) {
  store_.wait({key(round.number, "master")}, opts_.join_timeout);
  std::string v = store_.get(key(round.number, "master"));
  auto colon = v.rfind(':');
  if (colon == std::string::npos) throw ProtocolError("bad master address in the store: " + v);
  return {v.substr(0, colon), static_cast<std::uint16_t>(stored_int(
                                  key(round.number, "master"), v.substr(colon + 1), 1, 65535))};
}

RoundEvent Rendezvous::end_round(const Round& round, const RoundEvent& event, bool reopen) {
  return end_round_number(round.number, event, reopen);
}

RoundEvent Rendezvous::end_round_number(int r, const RoundEvent& event, bool reopen) {
  std::string mine = encode(event);
  std::string held = store_.compare_set(key(r, "event"), "", mine);
  if (held != mine) return decode_event(held);
  // This node ended the round: it opens the next one for agents that start afresh.
  if (reopen) store_.add(prefix_ + "/round", 1);
  return event;
}

void Rendezvous::finished(const Round& round, const std::string& host, int group_rank) {
  claims_->finished();
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

EventWatcher::EventWatcher(const std::string& host, std::uint16_t port, std::string key,
                           rdzv::ClientOptions options) {
  auto client = std::make_unique<rdzv::StoreClient>(host, port, options);
  rdzv::StoreClient* c = client.get();
  store_ = std::move(client);
  interrupt_ = [c] { c->interrupt(); };
  efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd_ < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
  thread_ = std::thread([this, k = std::move(key)] { run(k); });
}

EventWatcher::EventWatcher(std::unique_ptr<rdzv::Store> store, std::function<void()> interrupt,
                           std::string key, std::chrono::milliseconds slice)
    : store_(std::move(store)), interrupt_(std::move(interrupt)) {
  slice_ = slice;
  efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd_ < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
  thread_ = std::thread([this, k = std::move(key)] { run(k); });
}

EventWatcher::~EventWatcher() {
  interrupt_();
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
        store_->wait({key}, slice_);
        break;
      } catch (const TimeoutError&) {
      }
    }
    ev = decode_event(store_->get(key));
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
