// MemoryStore: the Store interface over an in-process KvTable, for tests that run N ranks as
// threads (gloo's HashStore idea). Same semantics as a StoreClient on ddprund, no sockets.
#pragma once

#include <condition_variable>
#include <mutex>

#include "ddp/rdzv/kv_table.hpp"
#include "ddp/rdzv/store.hpp"

namespace ddp::rdzv {

class MemoryStore : public Store {
 public:
  explicit MemoryStore(std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : timeout_(timeout) {}

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  std::vector<std::string> list_keys() override;

 private:
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout);

  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable changed_;
  KvTable table_;
};

}  // namespace ddp::rdzv
