// The store's state: keys, queues, waiters and leases, with torch's TCPStore semantics.
// Pure: no I/O, no threads, no clock (callers pass `now`). Operations that change a key report
// the waiters they wake; the server turns those into STOP_WAITING replies.
#pragma once

#include <chrono>
#include <algorithm>
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

// What a KvTable tells of each change to its state, in order (the journal of ddprund
// --data-dir, journal.hpp). Waiters are not state: a restarted store has none.
class ChangeSink {
 public:
  virtual ~ChangeSink() = default;
  virtual void put(std::string_view key, std::string_view value) = 0;  // set, CAS, ADD
  virtual void erase(std::string_view key) = 0;
  virtual void append(std::string_view key, std::string_view data) = 0;
  virtual void queue_push(std::string_view key, std::string_view value) = 0;
  virtual void queue_pop(std::string_view key) = 0;
  // A lease granted (ttl 0: none; `bound`: to its connection's life), or one restored.
  virtual void lease(LeaseId id, Millis ttl, bool bound) = 0;
  virtual void lease_key(LeaseId id, std::string_view key) = 0;  // after the key's put
  virtual void lease_will(LeaseId id, std::string_view key, std::string_view value) = 0;
  // The lease and its keys are gone; a will that fires follows as a put.
  virtual void lease_drop(LeaseId id) = 0;
  virtual void next_lease(LeaseId id) = 0;  // ids below this were used (snapshots only)
};

// The owner of a bound lease restored from a journal: its connection is gone, and the next
// connection that renews it (LEASE_KEEPALIVE) becomes its owner.
inline constexpr std::uint64_t kDetachedOwner = ~std::uint64_t{0};
// How long a restored bound lease without a ttl waits for its owner to come back.
inline constexpr std::chrono::milliseconds kDetachedGrace{60000};

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
  std::size_t max_bytes() const { return max_bytes_; }

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
  // Renews the lease; a restored bound lease (kDetachedOwner) is bound to `caller` from now on.
  bool lease_keepalive(LeaseId id, Millis now, WaiterId caller = 0);
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
  // The server was not running for `gap` (stopped, or its host suspended): no client could
  // renew its lease meanwhile, so every expiry moves by `gap`.
  void extend_leases(Millis gap);

  // --- the journal (journal.hpp) -----------------------------------------------------------
  // Every change from now on is told to `sink` (null: none).
  void set_sink(ChangeSink* sink) { sink_ = sink; }
  // The whole state as changes, as a snapshot holds it.
  void dump(ChangeSink& out) const;
  // Replay: a lease as it was (bound ones wait for their owner, kDetachedOwner), a key of it
  // (already put), and the first id not to hand out again.
  void restore_lease(LeaseId id, Millis ttl, bool bound, Millis now);
  void restore_lease_key(LeaseId id, std::string_view key);
  void restore_next_lease(LeaseId id) { next_lease_ = std::max(next_lease_, id); }

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
  ChangeSink* sink_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t max_bytes_ = 0;
};

}  // namespace ddp::rdzv
