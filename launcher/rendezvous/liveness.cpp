// The heartbeat thread and the lease will of liveness.hpp.
#include "ddp/launch/liveness.hpp"

#include "ddp/proto/error.hpp"

namespace ddp::launch {

Liveness::Liveness(const std::string& host, std::uint16_t port, rdzv::ClientOptions options,
                   std::chrono::milliseconds interval, int max_attempts)
    : interval_(interval), ttl_(interval * std::max(1, max_attempts)) {
  client_ = std::make_unique<rdzv::StoreClient>(host, port, options);
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
    client_->lease_revoke(lease_);
  } catch (const Error&) {
    // the store is gone: nothing to revoke
  }
}

void Liveness::set_will(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> g(mu_);
  will_key_ = key;
  will_value_ = value;
  if (!client_->lease_will(lease_, key, value)) renew_locked();
}

// The lease is gone (expired while this agent was stopped): a new one, with the same will.
void Liveness::renew_locked() {
  expirations_.fetch_add(1);
  lease_ = client_->lease_grant(ttl_, /*bind_to_connection=*/true);
  if (!will_key_.empty()) client_->lease_will(lease_, will_key_, will_value_);
}

void Liveness::beat() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, interval_, [this] { return stop_; })) {
    try {
      if (!client_->lease_keepalive(lease_)) renew_locked();
    } catch (const Error&) {
      return;  // the store is gone; the agent's own store calls will say so
    }
  }
}

}  // namespace ddp::launch
