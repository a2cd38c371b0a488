// Store: the key-value operations that the rendezvous, the agent and the trainer use, behind
// one interface (gloo's Store shape). StoreClient (TCP, any TCPStore server) and MemoryStore
// (in-process, for tests that run N ranks as threads) implement it with the same semantics:
// get and multi_get wait for their keys, wait throws ddp::TimeoutError naming the keys.
#pragma once

#include <charconv>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::rdzv {

// "a, b, c": keys as error messages name them.
inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(std::string_view key, std::string_view value) = 0;
  virtual std::string get(std::string_view key) = 0;
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  // torch's CAS: see KvTable::compare_set.
  virtual std::string compare_set(std::string_view key, std::string_view expected,
                                  std::string_view desired) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;  // the store's default timeout
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool delete_key(std::string_view key) = 0;
  virtual std::int64_t num_keys() = 0;
  virtual void append(std::string_view key, std::string_view value) = 0;  // creates when missing
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) = 0;
  virtual std::vector<std::string> list_keys() = 0;

  // Composite operations the rendezvous round uses. A backend that can do one in fewer requests
  // overrides it (etcd: issue 37); these defaults are the plain operations in sequence.
  //
  // WAIT for `key`, then its value (a value it held during the call).
  virtual std::string wait_get(std::string_view key, std::chrono::milliseconds timeout) {
    wait({std::string(key)}, timeout);
    return get(key);
  }
  // COMPARE_SET(key, "", desired) and, when `desired` is what `key` then holds, MULTI_SET(keys,
  // values): atomically where the backend can (a reader that sees `key` sees `keys`). Returns
  // what `key` holds, as compare_set does.
  virtual std::string create_with(std::string_view key, std::string_view desired,
                                  const std::vector<std::string>& keys,
                                  const std::vector<std::string>& values) {
    std::string held = compare_set(key, "", desired);
    if (held == desired) multi_set(keys, values);
    return held;
  }
};

// Raises the ASCII-decimal counter `key` to at least `at_least` (a COMPARE_SET loop, so that
// agents raising it together agree): counters put back after a store came back empty.
inline void raise_counter(Store& s, const std::string& key, std::int64_t at_least) {
  const std::string want = std::to_string(at_least);
  std::string held = s.compare_set(key, "", want);
  for (int i = 0; i < 100 && held != want; ++i) {
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(held.data(), held.data() + held.size(), v);
    if (ec != std::errc() || end != held.data() + held.size() || v >= at_least) return;
    held = s.compare_set(key, held, want);
  }
}

}  // namespace ddp::rdzv
