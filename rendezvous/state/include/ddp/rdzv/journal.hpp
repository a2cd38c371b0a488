// ddprund --data-dir: the store's state kept on disk, so that a restarted ddprund loses
// nothing. A write-ahead journal of every change (KvTable's ChangeSink) and a snapshot that
// the journal is compacted into; on start the snapshot then the journal are replayed.
//
// Durability (docs/rendezvous.md, "When the store goes away"): a change's record is in the
// journal file (copied into its shared mapping: the page cache) before its reply or any
// wake-up it causes leaves the server, so a ddprund that crashes or is killed loses nothing a
// client was told; the file is fdatasync'ed every `fsync_interval` (0: at every commit), which
// bounds what a crash of the whole host can lose. Files: DIR/snapshot, DIR/journal (each a header
// with the same generation, then records: journal_records.hpp), DIR/lock (one ddprund per
// directory).
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "ddp/rdzv/kv_table.hpp"

namespace ddp::rdzv {

struct JournalOptions {
  std::string dir;
  std::chrono::milliseconds fsync_interval{1000};
  // The journal is compacted into a new snapshot once it holds more than this, or more than
  // twice the last snapshot when that is larger.
  std::size_t compact_bytes = std::size_t{64} << 20;
};

struct ReplayReport {
  std::uint64_t records = 0;
  std::uint64_t keys = 0, leases = 0;  // in the table after the replay
  std::size_t torn_bytes = 0;          // dropped from the journal's end (a write cut short)
  std::string torn_why;
};

class Journal final : public ChangeSink {
 public:
  // Creates `dir` if needed, takes its lock, replays the snapshot and the journal into `table`
  // (which has no sink yet; its byte cap is lifted while replaying), and journals from then on.
  // Throws ddp::ConfigError when another process holds the directory or the snapshot is
  // damaged, ddp::IoError when the files cannot be read or written.
  Journal(JournalOptions options, KvTable& table, Millis now);
  ~Journal() override;  // writes what is buffered, fdatasyncs, and releases the lock
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  const ReplayReport& replayed() const { return replayed_; }

  void put(std::string_view key, std::string_view value) override;
  void erase(std::string_view key) override;
  void append(std::string_view key, std::string_view data) override;
  void queue_push(std::string_view key, std::string_view value) override;
  void queue_pop(std::string_view key) override;
  void lease(LeaseId id, Millis ttl, bool bound) override;
  void lease_key(LeaseId id, std::string_view key) override;
  void lease_will(LeaseId id, std::string_view key, std::string_view value) override;
  void lease_drop(LeaseId id) override;
  void next_lease(LeaseId id) override;

  // Writes the buffered records to the file (and fdatasyncs them with fsync_interval 0).
  // Called before replies and wake-ups leave the server. A failure to write is logged once and
  // counted in failed(); the store goes on in memory.
  void commit();
  // Records are buffered and not yet written.
  bool pending() const;
  bool wants_compaction() const;
  // Writes `table` as a new snapshot and starts an empty journal. The caller holds the table's
  // lock, so nothing changes meanwhile.
  void compact(const KvTable& table);

  std::size_t journal_bytes() const;
  std::uint64_t compactions() const;
  bool failed() const;

 private:
  void record(std::uint8_t type, std::uint64_t id, std::int64_t number, std::string_view key,
              std::string_view value);
  void replay(KvTable& table, Millis now);
  void open_journal(bool fresh, std::size_t keep);
  void map_to(std::size_t need);
  void unmap();
  void write_locked();
  void sync_loop();

  JournalOptions opts_;
  static constexpr std::size_t kFirstMap = std::size_t{1} << 20;
  int lock_fd_ = -1, fd_ = -1;
  std::mutex sync_mu_;  // guards sync_fd_ (the sync thread's descriptor of the journal)
  int sync_fd_ = -1;
  char* map_ = nullptr;  // the journal file, mapped; records are copied to map_[journal_bytes_]
  std::size_t map_cap_ = 0;
  std::uint64_t generation_ = 0;
  std::size_t journal_bytes_ = 0, snapshot_bytes_ = 0;
  std::uint64_t compactions_ = 0;
  ReplayReport replayed_;
  mutable std::mutex mu_;
  std::string buf_;
  // buf_ holds records: a commit with none (a read's) returns without the lock. A thread sees
  // its own records' flag, and commits only what its own request changed.
  std::atomic<bool> buffered_{false};
  bool dirty_ = false;  // written since the last fdatasync
  bool failed_ = false;
  bool stop_ = false;
  std::condition_variable cv_;
  std::thread sync_;
};

}  // namespace ddp::rdzv
