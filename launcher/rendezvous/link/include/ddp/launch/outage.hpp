// Riding out an unreachable rendezvous store (docs/rendezvous.md, "When the store goes away"),
// the pure parts: the reconnection backoff (capped exponential with full jitter, so that
// thousands of agents do not reconnect to a restarted store in one burst) and the agent's
// account of its outages (when each began, how long it lasted, when to give up). No sockets,
// no clock of its own: callers pass `now`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>

namespace ddp::launch {

using OutageClock = std::chrono::steady_clock;

struct Backoff {
  std::chrono::milliseconds base{100};
  std::chrono::milliseconds cap{5000};
  // The pause before reconnection attempt `attempt` (0, 1, ...): uniform in
  // [0, min(cap, base * 2^attempt)], `unit` being a random number in [0, 1).
  std::chrono::milliseconds delay(int attempt, double unit) const;
};

// A small, seedable random source for the jitter (each agent seeds it with its pid and time).
class Jitter {
 public:
  explicit Jitter(std::uint64_t seed) : state_(seed | 1) {}
  double next();  // [0, 1)

 private:
  std::uint64_t state_;
};

// What the agent has seen of its store's outages, for the live status and the exit summary.
struct OutageSummary {
  int count = 0;       // outages so far (the current one included)
  double total_s = 0;  // their length together (the current one so far)
  double away_s = -1;  // how long the current one has lasted; -1: the store is there
  double last_s = 0;   // the length of the last one that ended
  std::string error;   // what the current (or last) one began with
};

// The agent's outages, as its connections report them: an outage begins when the first
// connection loses the store and ends when every connection that lost it is back (or gone).
// Each connection decides itself when it gives up (its own loss older than the grace).
// Thread-safe (the watcher thread and the agent's loop both report).
class OutageMonitor {
 public:
  struct Events {
    std::function<void(const std::string&)> say;        // a line for stderr
    std::function<void(const OutageSummary&)> changed;  // the live status
  };
  OutageMonitor(std::string where, std::chrono::milliseconds grace, Events events = {});

  void lost(const std::string& who, const std::string& error, OutageClock::time_point now);
  void back(const std::string& who, OutageClock::time_point now);
  // The connection is closed while it had lost the store: it no longer counts (nothing said).
  void forget(const std::string& who, OutageClock::time_point now);
  // Why a connection gives up after `lasted` seconds: the flag and `error`.
  std::string give_up_message(double lasted, const std::string& error) const;
  OutageSummary summary(OutageClock::time_point now) const;
  std::chrono::milliseconds grace() const { return grace_; }
  const std::string& where() const { return where_; }

 private:
  OutageSummary summary_locked(OutageClock::time_point now) const;

  std::string where_;
  std::chrono::milliseconds grace_;
  Events events_;
  mutable std::mutex mu_;
  std::set<std::string> away_;  // connections that lost the store and are not back
  OutageClock::time_point began_{};
  double ended_total_s_ = 0;
  OutageSummary last_;
};

// "12.3 s", "4 min 5 s": a duration as the messages say it.
std::string say_seconds(double s);

}  // namespace ddp::launch
