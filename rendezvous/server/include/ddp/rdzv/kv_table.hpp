// The store's state: keys, queues, waiters and leases, with torch's TCPStore semantics.
// Pure: no I/O, no threads, no clock (callers pass `now`). Operations that change a key report
// the waiters they wake; the server turns those into STOP_WAITING replies.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ddp::rdzv {

using WaiterId = std::uint64_t;
using LeaseId = std::uint64_t;
using Millis = std::chrono::milliseconds;  // a point on the caller's steady clock
using Woken = std::vector<WaiterId>;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class KvTable {
 public:
  // Every stored key, value and queued item is counted as its bytes plus this overhead.
  static constexpr std::size_t kEntryOverhead = 64;
  // Every lease is counted as this plus its will's key and value, so that leases (which may
  // outlive their connection) are bounded by the same cap as keys.
  static constexpr std::size_t kLeaseOverhead = 128;

  // 0: no limit. Otherwise a write that would take the total past it throws ProtocolError,
  // and the table is left as it was.
  void set_max_bytes(std::size_t max) { max_bytes_ = max; }
  std::size_t bytes() const { return bytes_; }

  // --- keys --------------------------------------------------------------------------------
  void set(std::string_view key, std::string_view value, Woken& woken);
  // torch's CAS: missing & expected empty -> set, return desired; missing & expected
  // non-empty -> return expected, no set; present -> swap if equal, return the stored value.
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired,
                          Woken& woken);
  const std::string* get(std::string_view key) const;
  // Values are ASCII decimal; a missing key counts as 0. Throws ddp::ProtocolError if the
  // stored value is not a number or the sum overflows.
  std::int64_t add(std::string_view key, std::int64_t delta, Woken& woken);
  void append(std::string_view key, std::string_view data, Woken& woken);
  bool erase(std::string_view key);  // does not wake waiters (torch)
  std::size_t num_keys() const { return kv_.size(); }
  std::vector<std::string_view> list_keys() const;
  // A key "exists" for CHECK/WAIT when it holds a value or a non-empty queue.
  bool exists(std::string_view key) const;

  // --- queues ------------------------------------------------------------------------------
  void queue_push(std::string_view key, std::string_view value, Woken& woken);  // wakes one
  // Returns the length before the pop; `out` receives the value when it was > 0.
  std::int64_t queue_pop(std::string_view key, std::string& out);
  std::int64_t queue_len(std::string_view key) const;

  // --- waiters -----------------------------------------------------------------------------
  // True if every key exists now; otherwise `w` is registered and woken later.
  bool wait(WaiterId w, std::span<const std::string_view> keys);
  // Adds 1 to `key`; true if the count reached `world_size` now (others waiting are woken),
  // otherwise `w` is registered until it does.
  bool barrier(WaiterId w, std::string_view key, std::int64_t world_size, Woken& woken);
  void cancel(WaiterId w);  // drops every registration of `w`
  bool is_waiting(WaiterId w) const { return awaited_.contains(w); }

  // --- leases (ddprun extension) -----------------------------------------------------------
  // ttl 0 means no expiry; owner != 0 binds the lease to that connection's life. `creator`
  // (the granting connection) may hold at most `max_per_creator` live leases (0: no limit);
  // past it, or past the byte cap, throws ProtocolError.
  LeaseId lease_grant(Millis ttl, WaiterId owner, Millis now, WaiterId creator = 0,
                      std::size_t max_per_creator = 0);
  bool lease_keepalive(LeaseId id, Millis now);
  bool lease_revoke(LeaseId id);  // deletes the lease's keys
  bool set_with_lease(std::string_view key, std::string_view value, LeaseId id, Woken& woken);
  // The lease's will (key set to value if absent when the lease expires or its owner's
  // connection closes; not on revoke). An empty key clears it.
  bool lease_will(LeaseId id, std::string_view key, std::string_view value);
  // The connection closed: its waits and bound leases go (their wills fire into `woken`).
  void release_owner(WaiterId owner, Woken& woken);
  std::optional<Millis> next_expiry() const;
  // Drops leases past their ttl (their wills fire into `woken`); returns how many.
  std::size_t expire(Millis now, Woken& woken);
  std::size_t num_leases() const { return leases_.size(); }

 private:
  struct Awaited {
    std::int64_t pending = 0;
    std::vector<std::string> keys;  // where `w` is registered, to undo on cancel
  };
  struct BarrierWaiter {
    WaiterId w;
    std::int64_t world_size;
  };
  struct Lease {
    Millis ttl{0};
    Millis expiry{0};
    WaiterId owner = 0;
    WaiterId creator = 0;
    std::unordered_set<std::string> keys;
    std::string will_key, will_value;
  };

  static std::size_t entry_bytes(std::string_view key, std::string_view value);
  void charge(std::int64_t delta, std::string_view key);  // throws when over max_bytes_
  void changed(std::string_view key, Woken& woken);
  void detach_lease(std::string_view key);
  // Deletes the lease and its keys; with `woken`, then carries out its will.
  void drop_lease(std::unordered_map<LeaseId, Lease>::iterator it, Woken* woken = nullptr);

  StringMap<std::string> kv_;
  StringMap<std::deque<std::string>> queues_;
  StringMap<std::vector<WaiterId>> waiting_;
  StringMap<std::vector<BarrierWaiter>> barriers_;
  std::unordered_map<WaiterId, Awaited> awaited_;
  std::unordered_map<LeaseId, Lease> leases_;
  StringMap<LeaseId> key_lease_;
  std::unordered_map<WaiterId, std::size_t> leases_by_creator_;
  LeaseId next_lease_ = 1;
  std::size_t bytes_ = 0;
  std::size_t max_bytes_ = 0;
};

}  // namespace ddp::rdzv
