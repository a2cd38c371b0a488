// EtcdStore: the rendezvous Store (store.hpp) on an etcd v3 cluster, so that the c10d rounds
// (launcher/rendezvous.cpp) run unchanged on etcd (issue 21). Every key is stored under a prefix
// (--rdzv-conf key_prefix). The mapping, each an O(1) number of etcd requests:
// - set/get/check/delete/multi_set/multi_get/list/num_keys: put, range, txn of ranges or puts;
// - compare_set: one txn (create_revision == 0 for an absent key, else value == expected);
// - add: a counter is a set of entries "<key>/\x01add/<unique>" holding deltas. add puts its
//   entry and sums the entries at the revision of its own put: two requests whatever the number
//   of agents adding at once, no compare-and-swap to retry under contention;
// - wait: a range of the keys, then a watch from the next revision until every key has been
//   put (no polling); TimeoutError names the keys.
// A counter is read with add(key, 0); get() of a counter key waits for a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/rdzv/etcd/http.hpp"
#include "ddp/rdzv/store.hpp"

namespace ddp::rdzv::etcd {

class EtcdStore : public Store {
 public:
  // wait_timeout: the default of get/wait/multi_get.
  EtcdStore(EtcdOptions options, std::string prefix, std::chrono::milliseconds wait_timeout);
  ~EtcdStore() override;

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

  EtcdHttp& http() { return http_; }
  const std::string& prefix() const { return prefix_; }
  std::string full(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  // The keys' values at one revision (absent: not in the map), and that revision.
  struct Snapshot {
    std::int64_t revision = 0;
    std::vector<std::string> values;
    std::vector<bool> present;
  };
  Snapshot read(const std::vector<std::string>& keys);
  // Until every key is there (a read first, or a watch first); their values.
  std::vector<std::string> await(const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout, bool read_first);
  std::string unique();

  EtcdHttp http_;
  std::string prefix_;
  std::chrono::milliseconds wait_timeout_;
  std::string id_;  // this client's part of counter entry names
  std::uint64_t seq_ = 0;
};

}  // namespace ddp::rdzv::etcd
