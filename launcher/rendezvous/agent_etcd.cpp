// The agent's etcd-v3 parts (agent_etcd.hpp): an interruptible Store, the lease liveness with
// its will, and the round-event watcher.
#include "ddp/launch/agent_etcd.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/etcd/api.hpp"

#include "agent_store.hpp"

namespace ddp::launch {

namespace etcd = rdzv::etcd;

namespace detail {
CancelFd::CancelFd() : fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
}
CancelFd::~CancelFd() { ::close(fd); }
}  // namespace detail

namespace {

etcd::EtcdOptions with_cancel(etcd::EtcdOptions o, int fd) {
  o.cancel_fd = fd;
  return o;
}

std::string agent_id() {
  std::random_device rd;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%08x%08x", rd(), rd());
  return hostname() + "-" + std::to_string(::getpid()) + "-" + hex;
}

}  // namespace

InterruptibleEtcdStore::InterruptibleEtcdStore(etcd::EtcdOptions options, std::string prefix,
                                               std::chrono::milliseconds wait_timeout)
    : CancelFd(),
      EtcdStore(with_cancel(std::move(options), CancelFd::fd), std::move(prefix), wait_timeout) {}

void InterruptibleEtcdStore::interrupt() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(CancelFd::fd, &one, sizeof(one));
}

EtcdLiveness::EtcdLiveness(const EtcdSettings& settings, const std::string& run_key,
                           std::chrono::milliseconds interval, int max_attempts)
    : lease_http_([&] {
        // A keepalive answered later than the TTL is a missed beat anyway.
        etcd::EtcdOptions o = settings.options;
        o.timeout = std::max(interval * std::max(1, max_attempts), std::chrono::milliseconds(1000));
        o.connect_timeout = std::min(o.connect_timeout, o.timeout);
        o.cancel_fd = -1;
        return o;
      }()),
      interval_(interval) {
  const auto ttl_ms = interval * std::max(1, max_attempts);
  ttl_s_ = std::max<std::int64_t>(1, (ttl_ms.count() + 999) / 1000);
  will_prefix_ = settings.key_prefix + run_key + "/will/";
  will_key_ = will_prefix_ + agent_id();
  // Carried out through the rounds' key space (the key prefix), on a connection of its own.
  etcd::EtcdOptions eo = settings.options;
  eo.timeout = std::max(eo.timeout, std::chrono::milliseconds(1000));
  executor_ = std::make_unique<InterruptibleEtcdStore>(eo, settings.key_prefix, eo.timeout);
  {
    std::lock_guard<std::mutex> g(mu_);
    grant_locked();
  }
  beat_ = std::thread([this] { beat(); });
  watcher_ = std::thread([this] { watch_wills(); });
}

EtcdLiveness::~EtcdLiveness() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  executor_->interrupt();
  beat_.join();
  watcher_.join();
  try {
    will_.clear();
    put_will_locked();  // blank first: the revoke's delete then carries no will
    lease_http_.post("lease/revoke", etcd::lease_id_body(lease_));
  } catch (const Error&) {
    // etcd is gone: the lease expires on its own, and a blank will does nothing
  }
}

// A fresh lease, and the will key on it (at the start, or after the lease expired).
void EtcdLiveness::grant_locked() {
  const etcd::LeaseGrant g =
      etcd::parse_lease_grant(lease_http_.post("lease/grant", etcd::lease_grant_body(ttl_s_)));
  lease_ = g.id;
  put_will_locked();
}

void EtcdLiveness::put_will_locked() {
  const etcd::WriteResult w = etcd::parse_write(
      lease_http_.post("kv/put", etcd::put_body(etcd::Op::put(will_key_, will_, lease_))));
  if (watch_from_ == 0) watch_from_ = w.header.revision + 1;
}

void EtcdLiveness::set_will(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> g(mu_);
  will_ = key + "\n" + value;
  try {
    put_will_locked();
  } catch (const ProtocolError&) {  // the lease is gone (expired while this agent was stopped)
    expirations_.fetch_add(1);
    grant_locked();
  }
}

void EtcdLiveness::beat() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, interval_, [this] { return stop_; })) {
    try {
      const std::int64_t left =
          etcd::parse_keepalive(lease_http_.post("lease/keepalive", etcd::lease_id_body(lease_)));
      if (left <= 0) {  // expired: this agent was stopped or cut off for longer than the TTL
        expirations_.fetch_add(1);
        grant_locked();
      }
    } catch (const Error&) {
      // no member answered within the TTL: the next beat tries again (the lease may expire
      // meanwhile, and the others then re-form without this agent)
    }
  }
}

void EtcdLiveness::carry_out(const std::string& will) {
  const auto nl = will.find('\n');
  if (nl == std::string::npos || nl == 0) return;
  executor_->compare_set(will.substr(0, nl), "", will.substr(nl + 1));
}

// Watches every agent's will key; a delete of a key that held a will (its lease expired) posts
// that will unless the key already holds an event. All agents race; create-if-absent keeps one.
void EtcdLiveness::watch_wills() {
  std::int64_t from = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    from = watch_from_;
  }
  const std::string end = etcd::prefix_end(will_prefix_);
  while (true) {
    try {
      etcd::EtcdStream stream(executor_->http(), "watch",
                              etcd::watch_body(will_prefix_, end, from, true));
      while (true) {
        auto line = stream.next_line(etcd::Clock::now() + std::chrono::hours(24));
        if (!line) continue;
        const etcd::WatchMessage m = etcd::parse_watch_message(*line);
        if (m.canceled) {
          if (m.compact_revision > 0) from = m.compact_revision;
          break;
        }
        for (const etcd::WatchEvent& e : m.events) {
          // Carried out before `from` passes it: a failure here watches it again.
          if (e.deleted && e.prev_kv && !e.prev_kv->value.empty()) carry_out(e.prev_kv->value);
          from = std::max(from, e.kv.mod_revision + 1);
        }
      }
    } catch (const Error&) {
      // the member went away or the agent is stopping: watch again from `from` on another one
    }
    std::unique_lock<std::mutex> lk(mu_);
    if (cv_.wait_for(lk, std::chrono::milliseconds(200), [this] { return stop_; })) return;
  }
}

std::unique_ptr<InterruptibleEtcdStore> open_etcd_store(const EtcdSettings& settings,
                                                        const std::string& run_key) {
  auto store = std::make_unique<InterruptibleEtcdStore>(settings.options, settings.key_prefix,
                                                        settings.options.timeout);
  try {
    store->check({run_key + "/round"});
  } catch (const IoError& e) {
    throw IoError("the etcd cluster of --rdzv-endpoint (" +
                  etcd::endpoints_text(settings.options.endpoints) + ") did not answer within " +
                  std::to_string(settings.options.timeout.count()) +
                  " ms (--rdzv-conf read_timeout): " + e.what());
  }
  return store;
}

std::unique_ptr<rdzv::Store> open_etcd_view(const EtcdSettings& settings,
                                            std::chrono::milliseconds timeout) {
  etcd::EtcdOptions o = settings.options;
  o.timeout = timeout;
  o.connect_timeout = std::min(o.connect_timeout, timeout);
  o.cancel_fd = -1;
  return std::make_unique<etcd::EtcdStore>(o, settings.key_prefix, timeout);
}

std::unique_ptr<rdzv::Store> open_etcd_view(const std::string& members,
                                            const std::map<std::string, std::string>& conf) {
  LaunchConfig c;
  c.rdzv_backend = "etcd-v3";
  c.rdzv_endpoint = members;
  c.rdzv_conf = conf;
  const auto timeout = std::chrono::milliseconds(5000);
  return open_etcd_view(etcd_settings(c, timeout), timeout);
}

StoreLink etcd_link(std::unique_ptr<InterruptibleEtcdStore> store) {
  InterruptibleEtcdStore* raw = store.get();
  return {std::move(store), [raw] { raw->interrupt(); }};
}

LinkDial etcd_links(const EtcdSettings& settings, std::chrono::milliseconds timeout) {
  return [settings, timeout](bool again) {
    etcd::EtcdOptions o = settings.options;
    o.timeout = again ? std::min(timeout, std::chrono::milliseconds(5000)) : timeout;
    o.connect_timeout = std::min(o.connect_timeout, o.timeout);
    return etcd_link(
        std::make_unique<InterruptibleEtcdStore>(o, settings.key_prefix, settings.options.timeout));
  };
}

}  // namespace ddp::launch
