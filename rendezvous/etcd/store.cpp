// EtcdStore (etcd/store.hpp): the Store operations as etcd requests.
#include "ddp/rdzv/etcd/store.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/etcd/api.hpp"

namespace ddp::rdzv::etcd {

namespace {

constexpr std::string_view kCounter =
    "/\x01"
    "add/";  // a counter's entries: <key>/\x01add/<id>
constexpr int kMaxAppendTries = 1000;
constexpr std::size_t kMaxTxnOps = 128;  // etcd's default --max-txn-ops

std::int64_t parse_delta(const std::string& text, const std::string& key) {
  try {
    std::size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  DDP_THROW(ProtocolError, "etcd counter entry " + key + " holds '" + text + "', not a number");
}

// Between a broken watch and the next: a pause that never passes the deadline.
void retry_pause(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  std::this_thread::sleep_for(
      std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(100)));
}

bool is_counter_entry(std::string_view key) { return key.find(kCounter) != std::string_view::npos; }

}  // namespace

EtcdStore::EtcdStore(EtcdOptions options, std::string prefix,
                     std::chrono::milliseconds wait_timeout)
    : http_(std::move(options)), prefix_(std::move(prefix)), wait_timeout_(wait_timeout) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::random_device rd;
  const std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r));
  id_ = std::string(host) + "-" + std::to_string(::getpid()) + "-" + hex;
}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::unique() { return id_ + "-" + std::to_string(seq_++); }

EtcdStore::Snapshot EtcdStore::read(const std::vector<std::string>& keys) {
  // At most kMaxTxnOps ranges a txn (etcd's --max-txn-ops); the chunks after the first read at
  // the first one's revision, so the whole is one snapshot.
  Snapshot s;
  for (std::size_t at = 0; at < keys.size() || at == 0; at += kMaxTxnOps) {
    const std::size_t end = std::min(keys.size(), at + kMaxTxnOps);
    std::vector<Op> ops;
    ops.reserve(end - at);
    for (std::size_t i = at; i < end; ++i) {
      ops.push_back(Op::range(full(keys[i])));
      ops.back().revision = s.revision;  // 0 for the first chunk: the latest
    }
    const TxnResult t = parse_txn(http_.post("kv/txn", txn_body({}, ops, {})));
    if (t.ranges.size() != ops.size()) {
      DDP_THROW(ProtocolError, "etcd txn of " + std::to_string(ops.size()) + " ranges answered " +
                                   std::to_string(t.ranges.size()));
    }
    if (at == 0) s.revision = t.header.revision;
    for (const auto& r : t.ranges) {
      s.present.push_back(!r.kvs.empty());
      s.values.push_back(r.kvs.empty() ? std::string() : r.kvs.front().value);
    }
    if (keys.empty()) break;
  }
  return s;
}

void EtcdStore::set(std::string_view key, std::string_view value) {
  http_.post("kv/put", put_body(Op::put(full(key), std::string(value))));
}

std::string EtcdStore::get(std::string_view key) {
  const std::vector<std::string> keys{std::string(key)};
  for (;;) {
    Snapshot s = read(keys);
    if (s.present[0]) return s.values[0];
    wait(keys, wait_timeout_);
  }
}

std::int64_t EtcdStore::add(std::string_view key, std::int64_t delta) {
  const std::string entries = full(key) + std::string(kCounter);
  const Op range = Op::range(entries, prefix_end(entries));
  RangeResult r;
  if (delta != 0) {
    // One txn: the new entry, then the range, which reads the txn's own write (etcd's txns are
    // serial): the sum as of this add, exactly the entries before it and this one.
    const TxnResult t = parse_txn(http_.post(
        "kv/txn", txn_body({}, {Op::put(entries + unique(), std::to_string(delta)), range}, {})));
    if (t.ranges.size() != 1) {
      DDP_THROW(ProtocolError, "etcd txn of a put and a range answered " +
                                   std::to_string(t.ranges.size()) + " ranges");
    }
    r = t.ranges.front();
  } else {
    r = parse_range(http_.post("kv/range", range_body(range)));
  }
  std::int64_t sum = 0;
  for (const auto& kv : r.kvs) {
    if (__builtin_add_overflow(sum, parse_delta(kv.value, kv.key), &sum)) {
      DDP_THROW(ProtocolError, "etcd counter " + std::string(key) + " overflows int64");
    }
  }
  return sum;
}

std::string EtcdStore::compare_set(std::string_view key, std::string_view expected,
                                   std::string_view desired) {
  Compare c;
  c.key = full(key);
  if (expected.empty()) {
    c.target = Compare::Target::create;  // absent
    c.number = 0;
  } else {
    c.target = Compare::Target::value;
    c.value = std::string(expected);
  }
  const TxnResult t = parse_txn(http_.post(
      "kv/txn", txn_body({c}, {Op::put(full(key), std::string(desired))}, {Op::range(full(key))})));
  if (t.succeeded) return std::string(desired);
  if (t.ranges.empty() || t.ranges.front().kvs.empty()) return std::string(expected);
  return t.ranges.front().kvs.front().value;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  const Snapshot s = read(keys);
  return std::all_of(s.present.begin(), s.present.end(), [](bool p) { return p; });
}

void EtcdStore::wait(const std::vector<std::string>& keys) { wait(keys, wait_timeout_); }

void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (!keys.empty()) await(keys, timeout, /*read_first=*/true);
}

// Watched first: a key the round waits for is almost never there yet, and a watch and one read
// (2 requests) beat a read, a watch and a read (3). The value comes from the watch's event or
// from the read.
std::string EtcdStore::wait_get(std::string_view key, std::chrono::milliseconds timeout) {
  return await({std::string(key)}, timeout, /*read_first=*/false).front();
}

// One txn: `key` created from absent with `desired`, and `keys` with it; or, when `key` exists,
// what it holds. More than one txn's worth of keys: the rest follow in multi_set's txns.
std::string EtcdStore::create_with(std::string_view key, std::string_view desired,
                                   const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values) {
  if (keys.size() != values.size() || keys.size() + 1 > kMaxTxnOps ||
      std::find(keys.begin(), keys.end(), std::string(key)) != keys.end()) {
    return Store::create_with(key, desired, keys, values);
  }
  Compare c;
  c.key = full(key);
  c.target = Compare::Target::create;  // absent
  c.number = 0;
  std::map<std::string, std::string> last;  // etcd refuses a key twice in one txn: last wins
  for (std::size_t i = 0; i < keys.size(); ++i) last[full(keys[i])] = values[i];
  std::vector<Op> puts{Op::put(full(key), std::string(desired))};
  for (auto& [k, v] : last) puts.push_back(Op::put(k, v));
  const TxnResult t = parse_txn(http_.post("kv/txn", txn_body({c}, puts, {Op::range(full(key))})));
  if (t.succeeded) return std::string(desired);
  if (t.ranges.empty() || t.ranges.front().kvs.empty()) {
    DDP_THROW(ProtocolError, "etcd: " + std::string(key) + " neither created nor there");
  }
  return t.ranges.front().kvs.front().value;
}

std::vector<std::string> EtcdStore::await(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout, bool read_first) {
  const auto deadline = Clock::now() + timeout;
  std::map<std::string, std::string> seen;  // full key -> value, from events and reads
  auto values = [&] {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(seen[full(k)]);
    return out;
  };
  auto timed_out = [&](const std::set<std::string>& missing) {
    std::vector<std::string> named;
    for (const auto& k : keys) {
      if (missing.count(full(k)) != 0) named.push_back(k);
    }
    DDP_THROW(TimeoutError, "etcd: timed out after " + std::to_string(timeout.count()) +
                                " ms waiting for keys: " + join_keys(named));
  };
  for (;;) {
    std::set<std::string> missing;
    for (const auto& k : keys) missing.insert(full(k));
    if (read_first) {
      const Snapshot s = read(keys);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (s.present[i]) {
          missing.erase(full(keys[i]));
          seen[full(keys[i])] = s.values[i];
        }
      }
      if (missing.empty()) return values();
    }
    read_first = true;  // after a broken watch: read before watching again
    // One watch over [first missing, last missing] from now, then a second read once etcd has
    // created it: a put before the watch is in that read, a put after it comes on the watch.
    // (A watch that starts at a past revision is "unsynced" in etcd and gets its events only
    // at the next 100 ms resync, which put up to 100 ms on every round.) A stream that breaks
    // (its member died or lost the leader) is read again and watched anew on the next member,
    // until the deadline.
    const std::string lo = *missing.begin();
    const std::string hi = *missing.rbegin() + std::string(1, '\0');
    try {
      EtcdStream stream(http_, "watch", watch_body(lo, hi, 0, false));
      bool reread = false;
      for (;;) {
        auto line = stream.next_line(deadline);
        if (!line) timed_out(missing);
        WatchMessage m;
        try {
          m = parse_watch_message(*line);
        } catch (const ProtocolError& e) {
          // etcd's last word on a broken stream ("etcdserver: no leader" while it has no
          // quorum): the stream is gone, not the store; read and watch again, as for a break.
          DDP_THROW(IoError, std::string(e.what()) + " (the watch broke)");
        }
        if (m.canceled) {
          DDP_THROW(IoError, "etcd canceled a watch: " + m.cancel_reason);
        }
        for (const auto& e : m.events) {
          if (!e.deleted && missing.erase(e.kv.key) != 0) seen[e.kv.key] = e.kv.value;
        }
        if (m.created && !reread) {
          reread = true;
          const Snapshot again = read(keys);
          for (std::size_t i = 0; i < keys.size(); ++i) {
            if (again.present[i] && missing.erase(full(keys[i])) != 0) {
              seen[full(keys[i])] = again.values[i];
            }
          }
        }
        if (missing.empty()) return values();
      }
    } catch (const IoError&) {
      if (http_.cancelled() || Clock::now() >= deadline) throw;
      retry_pause(deadline);
    }
    if (Clock::now() >= deadline) timed_out(missing);
  }
}

bool EtcdStore::delete_key(std::string_view key) {
  const std::string k = full(key), entries = k + std::string(kCounter);
  const TxnResult t = parse_txn(
      http_.post("kv/txn", txn_body({}, {Op::del(k), Op::del(entries, prefix_end(entries))}, {})));
  return std::any_of(t.writes.begin(), t.writes.end(),
                     [](const WriteResult& w) { return w.deleted > 0; });
}

std::int64_t EtcdStore::num_keys() { return static_cast<std::int64_t>(list_keys().size()); }

void EtcdStore::append(std::string_view key, std::string_view value) {
  const std::string k = full(key);
  for (int i = 0; i < kMaxAppendTries; ++i) {
    const RangeResult r = parse_range(http_.post("kv/range", range_body(Op::range(k))));
    Compare c;
    c.key = k;
    std::string now;
    if (r.kvs.empty()) {
      c.target = Compare::Target::create;
    } else {
      c.target = Compare::Target::mod;
      c.number = r.kvs.front().mod_revision;
      now = r.kvs.front().value;
    }
    const TxnResult t =
        parse_txn(http_.post("kv/txn", txn_body({c}, {Op::put(k, now + std::string(value))}, {})));
    if (t.succeeded) return;
  }
  DDP_THROW(IoError, "etcd: append to " + std::string(key) + " lost " +
                         std::to_string(kMaxAppendTries) + " races in a row");
}

std::vector<std::string> EtcdStore::multi_get(const std::vector<std::string>& keys) {
  for (;;) {
    const Snapshot s = read(keys);
    if (std::all_of(s.present.begin(), s.present.end(), [](bool p) { return p; })) return s.values;
    wait(keys, wait_timeout_);
  }
}

void EtcdStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw ConfigError("multi_set: " + std::to_string(keys.size()) + " keys but " +
                      std::to_string(values.size()) + " values");
  }
  std::map<std::string, std::string> last;  // etcd refuses a key twice in one txn: last wins
  for (std::size_t i = 0; i < keys.size(); ++i) last[full(keys[i])] = values[i];
  std::vector<Op> puts;
  for (auto& [k, v] : last) puts.push_back(Op::put(k, v));
  for (std::size_t at = 0; at < puts.size(); at += kMaxTxnOps) {  // etcd's --max-txn-ops
    const auto end =
        puts.begin() + static_cast<std::ptrdiff_t>(std::min(puts.size(), at + kMaxTxnOps));
    http_.post(
        "kv/txn",
        txn_body({}, std::vector<Op>(puts.begin() + static_cast<std::ptrdiff_t>(at), end), {}));
  }
}

std::vector<std::string> EtcdStore::list_keys() {
  Op r = Op::range(prefix_.empty() ? std::string(1, '\0') : prefix_, prefix_end(prefix_));
  r.keys_only = true;
  const RangeResult rr = parse_range(http_.post("kv/range", range_body(r)));
  std::vector<std::string> out;
  for (const auto& kv : rr.kvs) {
    if (!is_counter_entry(kv.key)) out.push_back(kv.key.substr(prefix_.size()));
  }
  return out;
}

}  // namespace ddp::rdzv::etcd
