// ddprund --data-dir without sockets: the record format (torn tails, checksums), and a KvTable
// journaled, dropped and replayed: keys, counters, queues, leases (restored bound leases wait
// for their owner, expire with their will), compaction and its interrupted case, the lock.
#include "ddp/rdzv/journal.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/journal_records.hpp"

using namespace ddp::rdzv;
namespace fs = std::filesystem;

namespace {

struct JournalDir {
  std::string path;
  JournalDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddp-journal-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~JournalDir() { fs::remove_all(path); }
};

JournalOptions options(const std::string& dir, std::size_t compact = 1 << 20) {
  JournalOptions o;
  o.dir = dir + "/data";
  o.fsync_interval = std::chrono::milliseconds(0);
  o.compact_bytes = compact;
  return o;
}

std::string value_of(const KvTable& t, std::string_view key) {
  const std::string* v = t.get(key);
  return v ? *v : "(absent)";
}

}  // namespace

TEST_CASE("journal records round-trip and a torn tail is named", "[unit][rdzv][journal]") {
  std::string buf;
  journal::encode(buf, {journal::Type::put, 0, 0, "key", "value"});
  journal::encode(buf, {journal::Type::lease, 7, 1500, "", "1"});
  auto a = journal::decode(buf);
  REQUIRE(a.status == journal::Decoded::record);
  CHECK(a.record.type == journal::Type::put);
  CHECK(a.record.key == "key");
  CHECK(a.record.value == "value");
  auto b = journal::decode(std::span<const char>(buf).subspan(a.consumed));
  REQUIRE(b.status == journal::Decoded::record);
  CHECK(b.record.id == 7);
  CHECK(b.record.number == 1500);
  CHECK(journal::decode(std::span<const char>(buf).subspan(a.consumed + b.consumed)).status ==
        journal::Decoded::end);

  // Every cut of the first record is torn, never a record.
  for (std::size_t cut = 1; cut < a.consumed; ++cut) {
    auto n = journal::decode(std::span<const char>(buf.data(), cut));
    CHECK(n.status == journal::Decoded::torn);
  }
  std::string flipped = buf;
  flipped[12] ^= 0x01;  // a payload byte
  auto bad = journal::decode(flipped);
  CHECK(bad.status == journal::Decoded::torn);
  CHECK(bad.why.find("checksum") != std::string::npos);
  CHECK(journal::crc32c(std::span<const char>("123456789", 9)) == 0xE3069283u);  // CRC-32C
  CHECK(journal::crc32c_portable(std::span<const char>("123456789", 9)) == 0xE3069283u);
  // The instruction's path and the table's agree on every length and alignment.
  std::string bytes;
  for (int i = 0; i < 300; ++i) bytes.push_back(static_cast<char>((i * 131 + 7) & 0xFF));
  for (std::size_t at = 0; at < 9; ++at) {
    for (std::size_t n = 0; at + n <= bytes.size(); n += 13) {
      const std::span<const char> part(bytes.data() + at, n);
      CHECK(journal::crc32c(part) == journal::crc32c_portable(part));
    }
  }
}

TEST_CASE("a journaled table comes back whole after its process is gone", "[unit][rdzv][journal]") {
  JournalDir d;
  Woken w;
  std::string popped;
  {
    KvTable t;
    Journal j(options(d.path), t, Millis(0));
    t.set("a", "1", w);
    t.add("counter", 5, w);
    t.add("counter", 2, w);
    t.compare_set("cas", "", "first", w);
    t.compare_set("cas", "nope", "second", w);  // no change
    t.append("log", "ab", w);
    t.append("log", "cd", w);
    t.set("gone", "x", w);
    t.erase("gone");
    t.queue_push("q", "one", w);
    t.queue_push("q", "two", w);
    t.queue_pop("q", popped);
    j.commit();
    // No destructor run: what a killed process leaves is what commit() wrote.
    t.set_sink(nullptr);
  }
  KvTable t;
  Journal j(options(d.path), t, Millis(0));
  CHECK(value_of(t, "a") == "1");
  CHECK(value_of(t, "counter") == "7");
  CHECK(value_of(t, "cas") == "first");
  CHECK(value_of(t, "log") == "abcd");
  CHECK(t.get("gone") == nullptr);
  CHECK(t.queue_len("q") == 1);
  CHECK(t.queue_pop("q", popped) == 1);
  CHECK(popped == "two");
  CHECK(j.replayed().keys == 4);
}

TEST_CASE("restored leases wait for their owner, and expire with their will if it never comes",
          "[unit][rdzv][journal]") {
  JournalDir d;
  Woken w;
  LeaseId kept = 0, lost = 0, revoked = 0;
  {
    KvTable t;
    Journal j(options(d.path), t, Millis(0));
    kept = t.lease_grant(Millis(1000), /*owner=*/11, Millis(0), 11);
    lost = t.lease_grant(Millis(1000), /*owner=*/12, Millis(0), 12);
    revoked = t.lease_grant(Millis(1000), 13, Millis(0), 13);
    t.lease_will(kept, "/event", "kept lost");
    t.lease_will(lost, "/event", "agent lost");
    t.set_with_lease("/owned", "v", kept, w);
    t.lease_revoke(revoked);
    j.commit();
    t.set_sink(nullptr);
  }
  KvTable t;
  Journal j(options(d.path), t, Millis(5000));  // the restarted server's clock
  CHECK(t.num_leases() == 2);
  CHECK(value_of(t, "/owned") == "v");
  // The owner reconnects (connection 21) within the ttl: the lease is bound to it now.
  CHECK(t.lease_keepalive(kept, Millis(5500), 21));
  CHECK_FALSE(t.lease_keepalive(revoked, Millis(5500), 21));
  // The other owner never comes back: its lease expires a ttl after the restart, and its will
  // fires (the key was absent).
  CHECK(t.expire(Millis(5999), w) == 0);
  CHECK(t.expire(Millis(6001), w) == 1);
  CHECK(value_of(t, "/event") == "agent lost");
  // The re-attached lease now lives and dies with connection 21.
  t.release_owner(21, w);
  CHECK(t.num_leases() == 0);
  CHECK(t.get("/owned") == nullptr);
  // A new lease never reuses an id handed out before the restart.
  CHECK(t.lease_grant(Millis(1000), 0, Millis(7000)) > revoked);
}

TEST_CASE("compaction bounds the journal and loses nothing", "[unit][rdzv][journal]") {
  JournalDir d;
  Woken w;
  {
    KvTable t;
    Journal j(options(d.path, 4096), t, Millis(0));
    for (int i = 0; i < 2000; ++i) t.add("counter", 1, w);  // ~2000 records of one key
    t.lease_grant(Millis(0), 0, Millis(0));                 // an unbound lease, no ttl
    j.commit();
    REQUIRE(j.wants_compaction());
    j.compact(t);
    CHECK(j.compactions() == 1);
    CHECK(j.journal_bytes() == journal::kHeaderBytes);
    CHECK(fs::file_size(d.path + "/data/snapshot") < 1024);
    t.set("after", "compaction", w);
    j.commit();
    t.set_sink(nullptr);
  }
  {
    KvTable t;
    Journal j(options(d.path, 4096), t, Millis(0));
    CHECK(value_of(t, "counter") == "2000");
    CHECK(value_of(t, "after") == "compaction");
    CHECK(t.num_leases() == 1);
  }
  // A compaction interrupted after the new snapshot but before the new journal: the old
  // journal (an older generation) is skipped, not replayed twice.
  std::string stale;
  journal::encode_header(stale, 0);
  journal::encode(stale, {journal::Type::put, 0, 0, "counter", "1999"});  // older than the snapshot
  std::ofstream(d.path + "/data/journal", std::ios::binary | std::ios::trunc) << stale;
  KvTable t;
  Journal j(options(d.path, 4096), t, Millis(0));
  CHECK(value_of(t, "counter") == "2000");
  CHECK(j.replayed().records == 3);  // the snapshot's counter, lease and next id
}

TEST_CASE("a torn journal tail is dropped and named, a damaged snapshot stops the start",
          "[unit][rdzv][journal]") {
  JournalDir d;
  Woken w;
  std::size_t used = 0;
  {
    KvTable t;
    Journal j(options(d.path), t, Millis(0));
    t.set("whole", "1", w);
    t.set("torn", "2", w);
    j.commit();
    used = j.journal_bytes();
    t.set_sink(nullptr);
  }
  const std::string path = d.path + "/data/journal";
  fs::resize_file(path, used - 3);  // a write cut short by a crash
  {
    KvTable t;
    Journal j(options(d.path), t, Millis(0));
    CHECK(value_of(t, "whole") == "1");
    CHECK(t.get("torn") == nullptr);
    CHECK(j.replayed().torn_bytes > 0);
    t.set("next", "3", w);  // appended after the good records, not after the torn bytes
    j.commit();
    t.set_sink(nullptr);
  }
  {
    KvTable t;
    Journal j(options(d.path), t, Millis(0));
    CHECK(value_of(t, "next") == "3");
    CHECK(j.replayed().torn_bytes == 0);
  }
  {
    // A journal whose header was cut short as it was created held nothing: a fresh one.
    fs::resize_file(path, 5);
    KvTable t;
    Journal j(options(d.path), t, Millis(0));
    CHECK(t.num_keys() == 0);
    CHECK(j.replayed().torn_bytes == 5);
  }
  std::ofstream(d.path + "/data/snapshot", std::ios::binary) << "DDPRUNJ1\0\0\0\0\0\0\0\0garbage";
  KvTable t;
  CHECK_THROWS_AS(Journal(options(d.path), t, Millis(0)), ddp::ConfigError);
}

TEST_CASE("one data directory, one store", "[unit][rdzv][journal]") {
  JournalDir d;
  KvTable a, b;
  Journal first(options(d.path), a, Millis(0));
  try {
    Journal second(options(d.path), b, Millis(0));
    FAIL("a second journal on the same directory was opened");
  } catch (const ddp::ConfigError& e) {
    CHECK(std::string(e.what()).find("in use by another ddprund") != std::string::npos);
  }
}

TEST_CASE("a stopped server gives its leases the time it did not run", "[unit][rdzv][journal]") {
  KvTable t;
  Woken w;
  t.lease_grant(Millis(1000), 5, Millis(0), 5);
  t.extend_leases(Millis(60000));
  CHECK(t.expire(Millis(30000), w) == 0);
  CHECK(t.expire(Millis(61001), w) == 1);
}
