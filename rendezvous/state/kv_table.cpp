// KvTable: torch TCPStore semantics over hash maps, plus waiters, queues and leases.
// See kv_table.hpp for the contract; torch-compat.md §5.4 for the semantics copied here.
#include "ddp/rdzv/kv_table.hpp"

#include <algorithm>
#include <charconv>

#include "ddp/proto/error.hpp"

namespace ddp::rdzv {
namespace {

std::optional<std::int64_t> parse_count(std::string_view s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) return std::nullopt;
  return v;
}

void erase_one(std::vector<WaiterId>& list, WaiterId w) {
  list.erase(std::remove(list.begin(), list.end(), w), list.end());
}

// now + ttl, saturating: ttl 0 (or one past the clock's range) never expires.
Millis expiry_after(Millis now, Millis ttl) {
  if (ttl.count() <= 0 || ttl > Millis::max() - now) return Millis::max();
  return now + ttl;
}

std::int64_t signed_diff(std::size_t now, std::size_t before) {
  return static_cast<std::int64_t>(now) - static_cast<std::int64_t>(before);
}

}  // namespace

std::size_t KvTable::entry_bytes(std::string_view key, std::string_view value) {
  return key.size() + value.size() + kEntryOverhead;
}

void KvTable::charge(std::int64_t delta, std::string_view key) {
  if (delta > 0 && max_bytes_ != 0 && bytes_ + static_cast<std::size_t>(delta) > max_bytes_) {
    DDP_THROW(ProtocolError, "the store is full: writing key '" + std::string(key) + "' needs " +
                                 std::to_string(delta) + " more bytes, " + std::to_string(bytes_) +
                                 " of " + std::to_string(max_bytes_) +
                                 " are in use (ddprund --max-store-bytes)");
  }
  bytes_ = static_cast<std::size_t>(static_cast<std::int64_t>(bytes_) + delta);
}

void KvTable::set(std::string_view key, std::string_view value, Woken& woken) {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    charge(static_cast<std::int64_t>(entry_bytes(key, value)), key);
    kv_.emplace(std::string(key), std::string(value));
  } else {
    charge(signed_diff(value.size(), it->second.size()), key);
    it->second.assign(value);
  }
  detach_lease(key);
  if (sink_) sink_->put(key, value);
  changed(key, woken);
}

std::string KvTable::compare_set(std::string_view key, std::string_view expected,
                                 std::string_view desired, Woken& woken) {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (!expected.empty()) return std::string(expected);
    charge(static_cast<std::int64_t>(entry_bytes(key, desired)), key);
    kv_.emplace(std::string(key), std::string(desired));
    if (sink_) sink_->put(key, desired);
    changed(key, woken);
    return std::string(desired);
  }
  if (it->second == expected) {
    charge(signed_diff(desired.size(), it->second.size()), key);
    it->second.assign(desired);
    std::string out = it->second;
    if (sink_) sink_->put(key, desired);
    changed(key, woken);
    return out;
  }
  return it->second;
}

const std::string* KvTable::get(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::int64_t KvTable::add(std::string_view key, std::int64_t delta, Woken& woken) {
  auto it = kv_.find(key);
  std::int64_t current = 0;
  if (it != kv_.end()) {
    auto parsed = parse_count(it->second);
    if (!parsed) {
      DDP_THROW(ProtocolError, "ADD on key '" + std::string(key) + "' whose value is not a number");
    }
    current = *parsed;
  }
  std::int64_t next = 0;
  if (__builtin_add_overflow(current, delta, &next)) {
    DDP_THROW(ProtocolError, "ADD on key '" + std::string(key) + "' overflows int64");
  }
  std::string text = std::to_string(next);
  if (it == kv_.end()) {
    charge(static_cast<std::int64_t>(entry_bytes(key, text)), key);
    kv_.emplace(std::string(key), std::move(text));
  } else {
    charge(signed_diff(text.size(), it->second.size()), key);
    it->second = std::move(text);
  }
  if (sink_) sink_->put(key, kv_.find(key)->second);
  changed(key, woken);
  return next;
}

void KvTable::append(std::string_view key, std::string_view data, Woken& woken) {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    charge(static_cast<std::int64_t>(entry_bytes(key, data)), key);
    kv_.emplace(std::string(key), std::string(data));
  } else {
    charge(static_cast<std::int64_t>(data.size()), key);
    it->second.append(data);
  }
  if (sink_) sink_->append(key, data);
  changed(key, woken);
}

bool KvTable::erase(std::string_view key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  detach_lease(key);
  bytes_ -= entry_bytes(it->first, it->second);
  kv_.erase(it);
  if (sink_) sink_->erase(key);
  return true;
}

std::vector<std::string_view> KvTable::list_keys() const {
  std::vector<std::string_view> out;
  out.reserve(kv_.size());
  for (const auto& [k, v] : kv_) out.emplace_back(k);
  return out;
}

bool KvTable::exists(std::string_view key) const {
  if (kv_.find(key) != kv_.end()) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void KvTable::queue_push(std::string_view key, std::string_view value, Woken& woken) {
  charge(static_cast<std::int64_t>(entry_bytes(key, value)), key);
  auto it = queues_.find(key);
  if (it == queues_.end()) it = queues_.emplace(std::string(key), std::deque<std::string>{}).first;
  it->second.emplace_back(value);
  if (sink_) sink_->queue_push(key, value);
  // One value, one consumer: wake only the oldest waiter (torch's wakeupOneWaitingClient).
  auto w = waiting_.find(key);
  if (w == waiting_.end() || w->second.empty()) return;
  WaiterId first = w->second.front();
  w->second.erase(w->second.begin());
  if (w->second.empty()) waiting_.erase(w);
  auto a = awaited_.find(first);
  if (a != awaited_.end() && --a->second.pending <= 0) {
    awaited_.erase(a);
    woken.push_back(first);
  }
}

std::int64_t KvTable::queue_pop(std::string_view key, std::string& out) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return 0;
  auto len = static_cast<std::int64_t>(it->second.size());
  out = std::move(it->second.front());
  it->second.pop_front();
  bytes_ -= entry_bytes(key, out);
  if (it->second.empty()) queues_.erase(it);
  if (sink_) sink_->queue_pop(key);
  return len;
}

std::int64_t KvTable::queue_len(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size());
}

bool KvTable::wait(WaiterId w, std::span<const std::string_view> keys) {
  cancel(w);
  Awaited a;
  for (auto k : keys) {
    if (exists(k)) continue;
    ++a.pending;
    a.keys.emplace_back(k);
    auto it = waiting_.find(k);
    if (it == waiting_.end()) it = waiting_.emplace(std::string(k), std::vector<WaiterId>{}).first;
    it->second.push_back(w);
  }
  if (a.pending == 0) return true;
  awaited_.emplace(w, std::move(a));
  return false;
}

bool KvTable::barrier(WaiterId w, std::string_view key, std::int64_t world_size, Woken& woken) {
  cancel(w);
  std::int64_t count = add(key, 1, woken);  // wakes earlier arrivals once count >= theirs
  if (count >= world_size) return true;
  auto it = barriers_.find(key);
  if (it == barriers_.end()) {
    it = barriers_.emplace(std::string(key), std::vector<BarrierWaiter>{}).first;
  }
  it->second.push_back({w, world_size});
  Awaited a;
  a.pending = 1;
  a.keys.emplace_back(key);
  awaited_.emplace(w, std::move(a));
  return false;
}

void KvTable::cancel(WaiterId w) {
  auto a = awaited_.find(w);
  if (a == awaited_.end()) return;
  for (const auto& k : a->second.keys) {
    if (auto it = waiting_.find(k); it != waiting_.end()) {
      erase_one(it->second, w);
      if (it->second.empty()) waiting_.erase(it);
    }
    if (auto it = barriers_.find(k); it != barriers_.end()) {
      auto& v = it->second;
      v.erase(std::remove_if(v.begin(), v.end(), [w](const BarrierWaiter& b) { return b.w == w; }),
              v.end());
      if (v.empty()) barriers_.erase(it);
    }
  }
  awaited_.erase(a);
}

void KvTable::changed(std::string_view key, Woken& woken) {
  if (auto it = waiting_.find(key); it != waiting_.end()) {
    for (WaiterId w : it->second) {
      auto a = awaited_.find(w);
      if (a != awaited_.end() && --a->second.pending <= 0) {
        awaited_.erase(a);
        woken.push_back(w);
      }
    }
    waiting_.erase(it);
  }
  auto b = barriers_.find(key);
  if (b == barriers_.end()) return;
  auto count = parse_count(kv_.find(key)->second);
  if (!count) return;
  auto& list = b->second;
  auto reached = [&](const BarrierWaiter& bw) { return *count >= bw.world_size; };
  for (const auto& bw : list) {
    if (reached(bw)) {
      awaited_.erase(bw.w);
      woken.push_back(bw.w);
    }
  }
  list.erase(std::remove_if(list.begin(), list.end(), reached), list.end());
  if (list.empty()) barriers_.erase(b);
}

LeaseId KvTable::lease_grant(Millis ttl, WaiterId owner, Millis now, WaiterId creator,
                             std::size_t max_per_creator) {
  std::size_t& held = leases_by_creator_[creator];
  if (max_per_creator != 0 && held >= max_per_creator) {
    DDP_THROW(ProtocolError, "this connection holds " + std::to_string(held) +
                                 " live leases, the most one connection may hold (ddprund " +
                                 "--max-leases-per-connection)");
  }
  charge(static_cast<std::int64_t>(kLeaseOverhead), "(a new lease)");
  ++held;
  LeaseId id = next_lease_++;
  Lease l;
  l.ttl = ttl;
  l.expiry = expiry_after(now, ttl);
  l.owner = owner;
  l.creator = creator;
  leases_.emplace(id, std::move(l));
  if (sink_) sink_->lease(id, ttl, owner != 0);
  return id;
}

bool KvTable::lease_keepalive(LeaseId id, Millis now, WaiterId caller) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  if (it->second.owner == kDetachedOwner && caller != 0) it->second.owner = caller;
  it->second.expiry = expiry_after(now, it->second.ttl);
  return true;
}

void KvTable::extend_leases(Millis gap) {
  for (auto& [id, l] : leases_) {
    if (l.expiry != Millis::max())
      l.expiry = l.expiry > Millis::max() - gap ? Millis::max() : l.expiry + gap;
  }
}

void KvTable::restore_lease(LeaseId id, Millis ttl, bool bound, Millis now) {
  Lease l;
  l.ttl = ttl;
  l.expiry = expiry_after(now, bound && ttl.count() <= 0 ? kDetachedGrace : ttl);
  l.owner = bound ? kDetachedOwner : 0;
  bytes_ += kLeaseOverhead;
  ++leases_by_creator_[0];
  leases_[id] = std::move(l);
  next_lease_ = std::max(next_lease_, id + 1);
  if (sink_) sink_->lease(id, ttl, bound);
}

void KvTable::restore_lease_key(LeaseId id, std::string_view key) {
  auto it = leases_.find(id);
  if (it == leases_.end() || kv_.find(key) == kv_.end()) return;
  it->second.keys.emplace(key);
  key_lease_[std::string(key)] = id;
  if (sink_) sink_->lease_key(id, key);
}

void KvTable::dump(ChangeSink& out) const {
  for (const auto& [k, v] : kv_) out.put(k, v);
  for (const auto& [k, q] : queues_) {
    for (const auto& v : q) out.queue_push(k, v);
  }
  for (const auto& [id, l] : leases_) {
    out.lease(id, l.ttl, l.owner != 0);
    for (const auto& k : l.keys) out.lease_key(id, k);
    if (!l.will_key.empty()) out.lease_will(id, l.will_key, l.will_value);
  }
  out.next_lease(next_lease_);
}

bool KvTable::lease_revoke(LeaseId id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  drop_lease(it);
  return true;
}

bool KvTable::set_with_lease(std::string_view key, std::string_view value, LeaseId id,
                             Woken& woken) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  set(key, value, woken);  // detaches from any previous lease
  it->second.keys.emplace(key);
  key_lease_.emplace(std::string(key), id);
  if (sink_) sink_->lease_key(id, key);
  return true;
}

bool KvTable::lease_will(LeaseId id, std::string_view key, std::string_view value) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  if (key.empty()) value = {};
  auto& l = it->second;
  charge(signed_diff(key.size() + value.size(), l.will_key.size() + l.will_value.size()), key);
  l.will_key = key;
  l.will_value = value;
  if (sink_) sink_->lease_will(id, key, value);
  return true;
}

void KvTable::release_owner(WaiterId owner, Woken& woken) {
  cancel(owner);
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.owner == owner) drop_lease(it, &woken);
    it = next;
  }
}

std::optional<Millis> KvTable::next_expiry() const {
  std::optional<Millis> out;
  for (const auto& [id, l] : leases_) {
    if (l.expiry != Millis::max() && (!out || l.expiry < *out)) out = l.expiry;
  }
  return out;
}

std::size_t KvTable::expire(Millis now, Woken& woken) {
  std::size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.expiry <= now) {
      drop_lease(it, &woken);
      ++n;
    }
    it = next;
  }
  return n;
}

void KvTable::detach_lease(std::string_view key) {
  auto it = key_lease_.find(key);
  if (it == key_lease_.end()) return;
  if (auto l = leases_.find(it->second); l != leases_.end()) {
    l->second.keys.erase(std::string(key));
  }
  key_lease_.erase(it);
}

void KvTable::drop_lease(std::unordered_map<LeaseId, Lease>::iterator it, Woken* woken) {
  for (const auto& k : it->second.keys) {
    key_lease_.erase(k);
    if (auto kv = kv_.find(k); kv != kv_.end()) {
      bytes_ -= entry_bytes(kv->first, kv->second);
      kv_.erase(kv);
    }
  }
  std::string key = std::move(it->second.will_key);
  std::string value = std::move(it->second.will_value);
  bytes_ -= kLeaseOverhead + key.size() + value.size();
  if (auto c = leases_by_creator_.find(it->second.creator);
      c != leases_by_creator_.end() && --c->second == 0) {
    leases_by_creator_.erase(c);
  }
  if (sink_) sink_->lease_drop(it->first);
  leases_.erase(it);
  if (woken == nullptr || key.empty() || exists(key)) return;
  try {
    set(key, value, *woken);
  } catch (const std::exception&) {
    // Over the byte cap: the will is lost, the store stays as it was.
  }
}

}  // namespace ddp::rdzv
