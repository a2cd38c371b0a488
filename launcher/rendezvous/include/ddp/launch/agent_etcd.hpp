// The etcd-v3 backend's parts of the agent (docs/rendezvous.md), beside the TCP store's:
// - InterruptibleEtcdStore: the rounds' Store, whose calls a stop signal ends (a cancel eventfd);
// - EtcdLiveness: the agent's liveness on an etcd lease (TTL keep_alive_interval x
//   keep_alive_max_attempt, renewed every interval; no peer clock) and its will. etcd has no
//   will, so each agent keeps "<run>/will/<agent>" on its lease holding the will's key and
//   value; every agent watches the will keys, and a will key deleted by an expiry while it
//   still held a will is carried out (create-if-absent) by whichever agent sees it first. A
//   clean exit blanks the will before revoking the lease;
// - etcd_links: connections to the cluster for ResilientStore, which rides out a cluster that
//   lost its quorum or every member, as it rides out a TCP store's outage.
// Public for bench/etcd_rdzv_bench.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddp/launch/etcd_conf.hpp"
#include "ddp/launch/liveness.hpp"
#include "ddp/launch/rendezvous.hpp"
#include "ddp/launch/resilient_store.hpp"
#include "ddp/rdzv/etcd/store.hpp"

namespace ddp::launch {

namespace detail {
struct CancelFd {  // an eventfd, made before the store that polls it
  CancelFd();
  ~CancelFd();
  CancelFd(const CancelFd&) = delete;
  CancelFd& operator=(const CancelFd&) = delete;
  int fd = -1;
};
}  // namespace detail

class InterruptibleEtcdStore final : private detail::CancelFd, public rdzv::etcd::EtcdStore {
 public:
  InterruptibleEtcdStore(rdzv::etcd::EtcdOptions options, std::string prefix,
                         std::chrono::milliseconds wait_timeout);
  // Every call now and later fails at once with ddp::IoError (a latch, as StoreClient's).
  void interrupt();
};

class EtcdLiveness final : public AgentLiveness {
 public:
  // run_key: the run's key space as the rounds name it ("/ddprun/<run id>"). Throws what the
  // lease grant throws when no member answers.
  EtcdLiveness(const EtcdSettings& settings, const std::string& run_key,
               std::chrono::milliseconds interval, int max_attempts);
  ~EtcdLiveness() override;  // blanks the will and revokes the lease: no will fires
  EtcdLiveness(const EtcdLiveness&) = delete;
  EtcdLiveness& operator=(const EtcdLiveness&) = delete;

  void set_will(const std::string& key, const std::string& value) override;
  int expirations() const { return expirations_.load(); }
  std::int64_t ttl_seconds() const { return ttl_s_; }

 private:
  void grant_locked();
  void put_will_locked();
  void beat();
  void watch_wills();
  void carry_out(const std::string& will);

  rdzv::etcd::EtcdHttp lease_http_;                   // grant, keepalive, the will key (under mu_)
  std::unique_ptr<InterruptibleEtcdStore> executor_;  // the will watcher's thread
  std::string will_prefix_, will_key_;                // full etcd keys
  std::chrono::milliseconds interval_;
  std::int64_t ttl_s_ = 1;
  std::int64_t lease_ = 0;
  std::int64_t watch_from_ = 0;  // the revision the will watch starts at
  std::string will_;             // "<key>\n<value>", empty: none
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> expirations_{0};
  std::thread beat_, watcher_;
};

// The rounds' store on the etcd cluster, checked at once: a cluster that does not answer within
// the request timeout is a ddp::IoError naming --rdzv-endpoint's members.
std::unique_ptr<InterruptibleEtcdStore> open_etcd_store(const EtcdSettings& settings,
                                                        const std::string& run_key);

// A plain store on the cluster for the live status (its publishing, its views, `ddprun status`),
// each request within `timeout`.
std::unique_ptr<rdzv::Store> open_etcd_view(const EtcdSettings& settings,
                                            std::chrono::milliseconds timeout);
// `ddprun status --rdzv-backend etcd-v3`: the members and --rdzv-conf as the agents had them
// (ddp::ConfigError naming what is wrong with them).
std::unique_ptr<rdzv::Store> open_etcd_view(const std::string& members,
                                            const std::map<std::string, std::string>& conf);

// The rounds' store on the etcd cluster as it is first opened, as a link.
StoreLink etcd_link(std::unique_ptr<InterruptibleEtcdStore> store);
// New connections to the cluster, each request trying the members for at most `timeout`
// (reconnecting, `again`: at most 5 s; the backoff paces the attempts).
LinkDial etcd_links(const EtcdSettings& settings, std::chrono::milliseconds timeout);

}  // namespace ddp::launch
