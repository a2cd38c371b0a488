// The heartbeat thread and the lease will of liveness.hpp.
#include "ddp/launch/liveness.hpp"

#include <unistd.h>

#include "ddp/launch/outage.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {

Liveness::Liveness(Connect connect, std::chrono::milliseconds interval, int max_attempts)
    : connect_(std::move(connect)),
      interval_(interval),
      ttl_(interval * std::max(1, max_attempts)) {
  client_ = connect_(false);
  lease_ = client_->lease_grant(ttl_, /*bind_to_connection=*/true);
  thread_ = std::thread([this] { beat(); });
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  try {
    if (client_) client_->lease_revoke(lease_);
  } catch (const Error&) {
    // the store is gone: nothing to revoke
  }
}

// While the store is away the will is only remembered; the heartbeat sets it on reconnecting.
void Liveness::set_will(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> g(mu_);
  will_key_ = key;
  will_value_ = value;
  if (!client_) return;
  try {
    if (!client_->lease_will(lease_, key, value)) renew_locked();
  } catch (const Error&) {
    client_.reset();  // the heartbeat reconnects
  }
}

// The lease is gone (expired while this agent was stopped or cut off, or the store came back
// without it): a new one, with the same will.
void Liveness::renew_locked() {
  expirations_.fetch_add(1);
  lease_ = client_->lease_grant(ttl_, /*bind_to_connection=*/true);
  if (!will_key_.empty()) client_->lease_will(lease_, will_key_, will_value_);
}

// On a new connection: the same lease if the store still holds it (now bound to this
// connection), its will set again; otherwise a new lease.
void Liveness::reattach_locked() {
  client_ = connect_(true);
  reconnections_.fetch_add(1);
  if (!client_->lease_keepalive(lease_)) {
    renew_locked();
  } else if (!will_key_.empty()) {
    client_->lease_will(lease_, will_key_, will_value_);
  }
}

void Liveness::beat() {
  Backoff backoff;
  Jitter jitter(static_cast<std::uint64_t>(::getpid()) * 7919 + lease_);
  int attempt = 0;
  std::chrono::milliseconds pause = interval_;
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, pause, [this] { return stop_; })) {
    try {
      if (!client_) {
        reattach_locked();
      } else if (!client_->lease_keepalive(lease_)) {
        renew_locked();
      }
      attempt = 0;
      pause = interval_;
    } catch (const Error&) {
      client_.reset();  // the store is away: reconnect after a pause
      pause = std::min(interval_, backoff.delay(attempt++, jitter.next()));
    }
  }
}

}  // namespace ddp::launch
