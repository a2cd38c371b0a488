// MemoryStore: KvTable under one mutex; every change wakes every waiter, which re-checks its
// keys (fine for the few threads of a test).
#include "ddp/rdzv/memory_store.hpp"

#include "ddp/proto/error.hpp"

namespace ddp::rdzv {

void MemoryStore::set(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  Woken woken;
  table_.set(key, value, woken);
  changed_.notify_all();
}

std::string MemoryStore::get(std::string_view key) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, {std::string(key)}, timeout_);
  const std::string* v = table_.get(key);
  return v ? *v : std::string();
}

std::int64_t MemoryStore::add(std::string_view key, std::int64_t delta) {
  std::lock_guard<std::mutex> g(mu_);
  Woken woken;
  std::int64_t v = table_.add(key, delta, woken);
  changed_.notify_all();
  return v;
}

std::string MemoryStore::compare_set(std::string_view key, std::string_view expected,
                                     std::string_view desired) {
  std::lock_guard<std::mutex> g(mu_);
  Woken woken;
  std::string v = table_.compare_set(key, expected, desired, woken);
  changed_.notify_all();
  return v;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& k : keys) {
    if (!table_.exists(k)) return false;
  }
  return true;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, timeout);
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock,
                              const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  auto all = [&] {
    for (const auto& k : keys) {
      if (!table_.exists(k)) return false;
    }
    return true;
  };
  if (!changed_.wait_for(lock, timeout, all)) {
    throw TimeoutError("wait for [" + join_keys(keys) + "] timed out after " +
                       std::to_string(timeout.count()) + " ms");
  }
}

bool MemoryStore::delete_key(std::string_view key) {
  std::lock_guard<std::mutex> g(mu_);
  return table_.erase(key);
}

std::int64_t MemoryStore::num_keys() {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<std::int64_t>(table_.num_keys());
}

void MemoryStore::append(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  Woken woken;
  table_.append(key, value, woken);
  changed_.notify_all();
}

std::vector<std::string> MemoryStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, timeout_);
  std::vector<std::string> out;
  for (const auto& k : keys) {
    const std::string* v = table_.get(k);
    out.push_back(v ? *v : std::string());
  }
  return out;
}

void MemoryStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw ConfigError("multi_set: keys and values differ in count");
  std::lock_guard<std::mutex> g(mu_);
  Woken woken;
  for (std::size_t i = 0; i < keys.size(); ++i) table_.set(keys[i], values[i], woken);
  changed_.notify_all();
}

std::vector<std::string> MemoryStore::list_keys() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> out;
  for (auto k : table_.list_keys()) out.emplace_back(k);
  return out;
}

}  // namespace ddp::rdzv
