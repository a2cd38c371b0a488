// A Store that rides out an unreachable store (the TCP store, or the etcd cluster): a request
// whose connection fails (ddp::IoError) is retried on a new connection, reconnecting with
// outage.hpp's backoff, until the store is back or the agent's outage has lasted longer than
// --store-outage-grace (then ddp::IoError naming the store and how long it was gone). Used for the
// agent's rendezvous connection and its round watcher (docs/rendezvous.md, "When the store goes
// away").
//
// A request that was sent and whose reply was lost may have been applied: SET, CAS from
// absent, WAIT, GET and the reads are safe to repeat; an ADD repeated may count twice (the
// rendezvous' counters only ever grow, and a double count there costs at most a re-form).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "ddp/launch/outage.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/store.hpp"

namespace ddp::launch {

using Dial = std::function<std::unique_ptr<rdzv::StoreClient>(bool again)>;

// Connections to host:port with `base`'s settings; reconnecting (`again`), each attempt
// connects for at most a second: the backoff paces the attempts.
Dial dialer(std::string host, std::uint16_t port, rdzv::ClientOptions base);

// One connection to a store, and how another thread ends the request in progress on it (and
// every later one) with ddp::IoError.
struct StoreLink {
  std::unique_ptr<rdzv::Store> store;
  std::function<void()> interrupt;
};
using LinkDial = std::function<StoreLink(bool again)>;
// A TCP connection as a link; the dialer's connections as links.
StoreLink tcp_link(std::unique_ptr<rdzv::StoreClient> client);
LinkDial tcp_links(Dial dial);

class ResilientStore final : public rdzv::Store {
 public:
  struct Setup {
    // A new connection (always with `again`: connecting briefly, the backoff paces).
    LinkDial connect;
    OutageMonitor* monitor = nullptr;  // the agent's account (required): its grace, its messages
    std::string who;                   // this connection, as the monitor counts them
    bool report = true;                // tell the monitor of this connection's outages
    // Impatient: a request during an outage fails at once (ddp::IoError), and reconnecting is
    // tried again only after the backoff's pause (the hang monitor's bus: it must never hold
    // up the agent's loop).
    bool impatient = false;
    int cancel_fd = -1;  // readable (a stop signal): stop reconnecting at once (left unread)
    // Runs on each new connection after a loss, before the failed request is repeated: puts
    // back what the store lost (Rendezvous::republish). Any exception but ddp::IoError
    // ends the request with it (StoreStateLost, say).
    std::function<void(rdzv::Store&)> on_reconnect;
    Backoff backoff{};
    std::uint64_t seed = 1;
  };
  // `first`: the connection already made (no store: connect at the first request).
  ResilientStore(Setup setup, StoreLink first = {});
  ~ResilientStore() override;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  std::vector<std::string> list_keys() override;
  std::string wait_get(std::string_view key, std::chrono::milliseconds timeout) override;
  std::string create_with(std::string_view key, std::string_view desired,
                          const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) override;

  // Safe from any thread: the request in progress and every later one fail with
  // ddp::IoError "... interrupted" (a stop signal, or the watcher's end).
  void interrupt();
  // From now on an outage fails the request at once (the agent is stopping: nobody waits).
  void stop_waiting() { patient_ = false; }

 private:
  template <typename F>
  auto run(F&& op) -> decltype(op(std::declval<rdzv::Store&>()));
  std::shared_ptr<rdzv::Store> current();
  void pause(std::chrono::milliseconds d);
  void failed(const std::string& error, OutageClock::time_point now);

  Setup s_;
  std::mutex mu_;
  std::shared_ptr<rdzv::Store> client_;
  std::function<void()> interrupt_client_;  // client_'s
  std::atomic<bool> interrupted_{false}, patient_{true};
  int wake_fd_ = -1;  // eventfd: interrupt() ends a pause
  Jitter jitter_;
  // Since when this connection has lost the store (the epoch: it has not).
  OutageClock::time_point lost_since_{};
  int attempt_ = 0;
  OutageClock::time_point retry_after_{};  // impatient: no reconnecting before this
};

}  // namespace ddp::launch
