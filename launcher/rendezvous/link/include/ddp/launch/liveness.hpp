// An agent's liveness as the store sees it, on a connection of its own: one lease, bound to
// that connection and to a TTL (keep_alive_interval x keep_alive_max_attempt) that a heartbeat
// thread renews every keep_alive_interval, and the lease's will: "this agent is lost" posted
// as the current round's event. If the agent dies, its connection closes and the server
// carries out the will at once; if it hangs or is cut off, the lease expires on the server's
// clock (no peer's clock is trusted) and the will fires then. A clean exit revokes the lease.
// When the store goes away (restarted, stopped, cut off), the heartbeat reconnects with
// outage.hpp's backoff and renews the same lease on its new connection (a store restarted with
// --data-dir kept it, and binds it to that connection), or takes a new one with the same will
// (a store that came back empty). Its replies may take as long as the agent's outage grace: a
// connection given up early would fire the will of a lease the store still holds.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddp/rdzv/client.hpp"

namespace ddp::launch {

// An agent's liveness as the rounds see it, whatever the backend: from set_will on, losing this
// agent sets `key` to `value` if it is absent. Destroying it is a clean exit (no will).
class AgentLiveness {
 public:
  virtual ~AgentLiveness() = default;
  virtual void set_will(const std::string& key, const std::string& value) = 0;
};

// The TCP store's: a lease on the store (rdzv::StoreClient's lease commands).
class Liveness final : public AgentLiveness {
 public:
  // `connect(again)`: a new connection to the store (`again`: reconnecting; connect briefly).
  using Connect = std::function<std::unique_ptr<rdzv::StoreClient>(bool again)>;
  Liveness(Connect connect, std::chrono::milliseconds interval, int max_attempts);
  ~Liveness() override;  // revokes the lease: a clean exit fires no will
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // From now on, losing this agent sets `key` to `value` if it is absent.
  void set_will(const std::string& key, const std::string& value) override;
  // How many times the lease had expired when the heartbeat came back (the agent was stopped
  // or cut off for longer than the TTL, or the store came back empty); granted anew then.
  int expirations() const { return expirations_.load(); }
  int reconnections() const { return reconnections_.load(); }
  std::chrono::milliseconds ttl() const { return ttl_; }

 private:
  void beat();
  void renew_locked();
  void reattach_locked();

  Connect connect_;
  std::unique_ptr<rdzv::StoreClient> client_;  // null while the store is away
  std::chrono::milliseconds interval_, ttl_;
  std::uint64_t lease_ = 0;
  std::string will_key_, will_value_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> expirations_{0}, reconnections_{0};
  std::thread thread_;
};

}  // namespace ddp::launch
