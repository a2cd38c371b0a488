// The journal and snapshot files of ddprund --data-dir (journal.hpp): replay at start,
// buffered records written before replies, a thread that fdatasyncs, and compaction.
#include "ddp/rdzv/journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/journal_records.hpp"
#include "ddp/rdzv/log.hpp"

namespace ddp::rdzv {
namespace {

namespace fs = std::filesystem;
using journal::Type;

std::string errno_text() { return std::strerror(errno); }

// The whole file; false when it does not exist.
bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return false;
    DDP_THROW(IoError, "cannot read " + path + ": " + errno_text());
  }
  std::ostringstream s;
  s << in.rdbuf();
  out = std::move(s).str();
  return true;
}

void write_all(int fd, const char* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      DDP_THROW(IoError, "cannot write " + path + ": " + errno_text());
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes `bytes` to path.tmp, fsyncs it and renames it over `path`: readers see the old file
// or the whole new one.
void replace_file(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir + "/" + name, tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) DDP_THROW(IoError, "cannot create " + tmp + ": " + errno_text());
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) DDP_THROW(IoError, "cannot fsync " + tmp + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    DDP_THROW(IoError, "cannot rename " + tmp + ": " + errno_text());
  }
  sync_dir(dir);
}

// A ChangeSink that encodes into a string (the snapshot being written).
class Encoder final : public ChangeSink {
 public:
  explicit Encoder(std::string& out) : out_(out) {}
  void put(std::string_view k, std::string_view v) override { add(Type::put, 0, 0, k, v); }
  void erase(std::string_view k) override { add(Type::erase, 0, 0, k, {}); }
  void append(std::string_view k, std::string_view d) override { add(Type::append, 0, 0, k, d); }
  void queue_push(std::string_view k, std::string_view v) override {
    add(Type::queue_push, 0, 0, k, v);
  }
  void queue_pop(std::string_view k) override { add(Type::queue_pop, 0, 0, k, {}); }
  void lease(LeaseId id, Millis ttl, bool bound) override {
    add(Type::lease, id, ttl.count(), {}, bound ? "1" : "");
  }
  void lease_key(LeaseId id, std::string_view k) override { add(Type::lease_key, id, 0, k, {}); }
  void lease_will(LeaseId id, std::string_view k, std::string_view v) override {
    add(Type::lease_will, id, 0, k, v);
  }
  void lease_drop(LeaseId id) override { add(Type::lease_drop, id, 0, {}, {}); }
  void next_lease(LeaseId id) override { add(Type::next_lease, id, 0, {}, {}); }

 private:
  void add(Type t, std::uint64_t id, std::int64_t n, std::string_view k, std::string_view v) {
    journal::encode(out_, {t, id, n, k, v});
  }
  std::string& out_;
};

void apply(const journal::Record& r, KvTable& t, Millis now) {
  Woken woken;  // nobody waits on a table being replayed
  std::string popped;
  switch (r.type) {
    case Type::put: t.set(r.key, r.value, woken); break;
    case Type::erase: t.erase(r.key); break;
    case Type::append: t.append(r.key, r.value, woken); break;
    case Type::queue_push: t.queue_push(r.key, r.value, woken); break;
    case Type::queue_pop: t.queue_pop(r.key, popped); break;
    case Type::lease: t.restore_lease(r.id, Millis(r.number), r.value == "1", now); break;
    case Type::lease_key: t.restore_lease_key(r.id, r.key); break;
    case Type::lease_will: t.lease_will(r.id, r.key, r.value); break;
    case Type::lease_drop: t.lease_revoke(r.id); break;
    case Type::next_lease: t.restore_next_lease(r.id); break;
  }
}

}  // namespace

Journal::Journal(JournalOptions options, KvTable& table, Millis now) : opts_(std::move(options)) {
  std::error_code ec;
  fs::create_directories(opts_.dir, ec);
  if (ec) DDP_THROW(IoError, "cannot create --data-dir " + opts_.dir + ": " + ec.message());
  const std::string lock = opts_.dir + "/lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) DDP_THROW(IoError, "cannot open " + lock + ": " + errno_text());
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    DDP_THROW(ConfigError, "--data-dir " + opts_.dir + " is in use by another ddprund (it holds " +
                               lock + "); give each ddprund a directory of its own");
  }
  try {
    const std::size_t cap = table.max_bytes();
    table.set_max_bytes(0);
    replay(table, now);
    table.set_max_bytes(cap);
  } catch (...) {
    ::close(lock_fd_);
    unmap();
    if (fd_ >= 0) ::close(fd_);
    if (sync_fd_ >= 0) ::close(sync_fd_);
    throw;
  }
  table.set_sink(this);
  sync_ = std::thread([this] { sync_loop(); });
}

Journal::~Journal() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  sync_.join();
  std::lock_guard<std::mutex> g(mu_);
  write_locked();
  if (fd_ >= 0) {
    ::fdatasync(fd_);
    unmap();
    // A clean stop leaves no reserved space after the records.
    [[maybe_unused]] int rc = ::ftruncate(fd_, static_cast<off_t>(journal_bytes_));
    ::close(fd_);
  }
  if (sync_fd_ >= 0) ::close(sync_fd_);
  ::close(lock_fd_);
}

void Journal::replay(KvTable& table, Millis now) {
  std::string snap, log;
  std::uint64_t snap_gen = 0, log_gen = 0;
  const bool have_snap = read_file(opts_.dir + "/snapshot", snap);
  if (have_snap) {
    if (!journal::decode_header(snap, snap_gen)) {
      DDP_THROW(ConfigError, opts_.dir + "/snapshot is not a ddprund snapshot; move it away");
    }
    std::span<const char> rest(snap.data() + journal::kHeaderBytes,
                               snap.size() - journal::kHeaderBytes);
    while (true) {
      auto n = journal::decode(rest);
      if (n.status == journal::Decoded::end) break;
      if (n.status == journal::Decoded::torn) {
        DDP_THROW(ConfigError, opts_.dir + "/snapshot is damaged at byte " +
                                   std::to_string(snap.size() - rest.size()) + " (" + n.why +
                                   "); move it away to start from the journal alone");
      }
      apply(n.record, table, now);
      ++replayed_.records;
      rest = rest.subspan(n.consumed);
    }
    snapshot_bytes_ = snap.size();
  }
  generation_ = snap_gen;
  bool have_log = read_file(opts_.dir + "/journal", log);
  std::size_t good = journal::kHeaderBytes;
  bool truncate = !have_log;
  if (have_log && log.size() < journal::kHeaderBytes &&
      log.compare(0, log.size(), journal::kMagic.substr(0, log.size())) == 0) {
    // Its header was cut short by a crash as the journal was created: it held nothing.
    replayed_.torn_bytes = log.size();
    replayed_.torn_why = "a header cut short";
    have_log = false;
    truncate = true;
  }
  if (have_log && !journal::decode_header(log, log_gen)) {
    DDP_THROW(ConfigError, opts_.dir + "/journal is not a ddprund journal; move it away");
  }
  if (have_log && have_snap && log_gen != snap_gen) {
    // Compaction wrote the snapshot but stopped before the new journal replaced the old one:
    // everything in the old journal is in the snapshot.
    truncate = true;
  } else if (have_log) {
    generation_ = log_gen;
    std::span<const char> rest(log.data() + good, log.size() - good);
    while (true) {
      auto n = journal::decode(rest);
      if (n.status == journal::Decoded::end) break;
      if (n.status == journal::Decoded::torn) {
        // The space reserved after the last record reads as zeros: the end, not a tear.
        if (std::all_of(rest.begin(), rest.end(), [](char c) { return c == 0; })) break;
        replayed_.torn_bytes = rest.size();
        replayed_.torn_why = n.why;
        break;
      }
      apply(n.record, table, now);
      ++replayed_.records;
      good += n.consumed;
      rest = rest.subspan(n.consumed);
    }
  }
  replayed_.keys = table.num_keys();
  replayed_.leases = table.num_leases();
  if (replayed_.torn_bytes > 0) {
    logger("rdzv").warn("{}/journal: dropped its last {} bytes ({}): a write cut short by a crash",
                        opts_.dir, replayed_.torn_bytes, replayed_.torn_why);
  }
  open_journal(truncate, truncate ? journal::kHeaderBytes : good);
}

// Opens the journal to append after its first `keep` bytes; `fresh`: replaced by one holding
// only the header.
void Journal::open_journal(bool fresh, std::size_t keep) {
  const std::string path = opts_.dir + "/journal";
  if (fresh) {
    std::string header;
    journal::encode_header(header, generation_);
    replace_file(opts_.dir, "journal", header);
  }
  unmap();
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) DDP_THROW(IoError, "cannot open " + path + ": " + errno_text());
  {
    std::lock_guard<std::mutex> g(sync_mu_);
    if (sync_fd_ >= 0) ::close(sync_fd_);
    sync_fd_ = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  }
  if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0) {
    DDP_THROW(IoError, "cannot truncate " + path + ": " + errno_text());
  }
  journal_bytes_ = keep;
  map_to(keep + 1);
}

// The journal file is mapped (MAP_SHARED): a record is in the page cache the moment it is
// copied there, without a system call, and so survives the process (SIGKILL, a crash) as a
// write(2) would. The space is written with zeros before it is mapped: a full disk is an error
// here, never a SIGBUS later, and the blocks are allocated already (fallocate's unwritten
// extents cost a conversion at every page's first store). The mapping doubles as it fills.
void Journal::map_to(std::size_t need) {
  std::size_t cap = map_cap_ ? map_cap_ : kFirstMap;
  while (cap < need) cap *= 2;
  if (map_ && cap == map_cap_) return;
  struct stat st {};
  if (::fstat(fd_, &st) != 0) DDP_THROW(IoError, "cannot stat the journal: " + errno_text());
  static const std::string zeros(std::size_t{64} << 10, '\0');
  for (auto at = static_cast<std::size_t>(st.st_size); at < cap;) {
    const std::size_t n = std::min(zeros.size(), cap - at);
    const ssize_t w = ::pwrite(fd_, zeros.data(), n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      DDP_THROW(IoError, "cannot reserve " + std::to_string(cap) + " bytes for " + opts_.dir +
                             "/journal: " + errno_text());
    }
    at += static_cast<std::size_t>(w);
  }
  void* p = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) DDP_THROW(IoError, "cannot map " + opts_.dir + "/journal: " + errno_text());
  unmap();
  map_ = static_cast<char*>(p);
  map_cap_ = cap;
}

void Journal::unmap() {
  if (map_) ::munmap(map_, map_cap_);
  map_ = nullptr;
  map_cap_ = 0;
}

void Journal::record(std::uint8_t type, std::uint64_t id, std::int64_t number, std::string_view key,
                     std::string_view value) {
  std::lock_guard<std::mutex> g(mu_);
  if (failed_) return;
  journal::encode(buf_, {static_cast<Type>(type), id, number, key, value});
  buffered_.store(true, std::memory_order_relaxed);
}

void Journal::put(std::string_view k, std::string_view v) { record(1, 0, 0, k, v); }
void Journal::erase(std::string_view k) { record(2, 0, 0, k, {}); }
void Journal::append(std::string_view k, std::string_view d) { record(3, 0, 0, k, d); }
void Journal::queue_push(std::string_view k, std::string_view v) { record(4, 0, 0, k, v); }
void Journal::queue_pop(std::string_view k) { record(5, 0, 0, k, {}); }
void Journal::lease(LeaseId id, Millis ttl, bool bound) {
  record(6, id, ttl.count(), {}, bound ? "1" : "");
}
void Journal::lease_key(LeaseId id, std::string_view k) { record(7, id, 0, k, {}); }
void Journal::lease_will(LeaseId id, std::string_view k, std::string_view v) {
  record(8, id, 0, k, v);
}
void Journal::lease_drop(LeaseId id) { record(9, id, 0, {}, {}); }
void Journal::next_lease(LeaseId id) { record(10, id, 0, {}, {}); }

void Journal::write_locked() {
  if (buf_.empty() || failed_) return;
  try {
    map_to(journal_bytes_ + buf_.size());
    std::memcpy(map_ + journal_bytes_, buf_.data(), buf_.size());
    journal_bytes_ += buf_.size();
    dirty_ = true;
    if (opts_.fsync_interval.count() == 0 && ::fdatasync(fd_) == 0) dirty_ = false;
  } catch (const Error& e) {
    failed_ = true;
    logger("rdzv").critical(
        "{}; the store goes on in memory, and a restart would lose the changes from now on",
        e.what());
  }
  buf_.clear();
  if (buf_.capacity() > (std::size_t{1} << 20)) std::string().swap(buf_);
  // Cleared once the records are in the file (under mu_): a commit that sees it clear finds
  // its own records written, by whichever thread wrote them.
  buffered_.store(false, std::memory_order_release);
}

void Journal::commit() {
  if (!buffered_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> g(mu_);
  write_locked();
}

bool Journal::pending() const {
  std::lock_guard<std::mutex> g(mu_);
  return !buf_.empty() && !failed_;
}

bool Journal::wants_compaction() const {
  std::lock_guard<std::mutex> g(mu_);
  return !failed_ && journal_bytes_ > std::max(opts_.compact_bytes, 2 * snapshot_bytes_);
}

void Journal::compact(const KvTable& table) {
  std::lock_guard<std::mutex> g(mu_);
  write_locked();
  if (failed_) return;
  bool snapshot_replaced = false;
  try {
    std::string snap;
    journal::encode_header(snap, generation_ + 1);
    Encoder enc(snap);
    table.dump(enc);
    replace_file(opts_.dir, "snapshot", snap);
    snapshot_replaced = true;
    ++generation_;
    open_journal(true, journal::kHeaderBytes);
    snapshot_bytes_ = snap.size();
    dirty_ = false;
    ++compactions_;
  } catch (const Error& e) {
    if (snapshot_replaced) {
      // The old journal no longer matches the snapshot: changes appended to it would be lost.
      failed_ = true;
      logger("rdzv").critical("compacting the journal failed: {}; the store goes on in memory",
                              e.what());
      return;
    }
    // The old snapshot and journal still hold everything: appending goes on.
    logger("rdzv").error("compacting the journal failed: {}; it keeps growing", e.what());
  }
}

std::size_t Journal::journal_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return journal_bytes_;
}

std::uint64_t Journal::compactions() const {
  std::lock_guard<std::mutex> g(mu_);
  return compactions_;
}

bool Journal::failed() const {
  std::lock_guard<std::mutex> g(mu_);
  return failed_;
}

// fdatasync on a descriptor of its own, outside the records' lock: a sync that takes a while
// (a busy disk) never holds up the store.
void Journal::sync_loop() {
  if (opts_.fsync_interval.count() == 0) return;
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, opts_.fsync_interval, [this] { return stop_; })) {
    if (!dirty_) continue;
    dirty_ = false;
    lk.unlock();
    {
      std::lock_guard<std::mutex> g(sync_mu_);
      if (sync_fd_ >= 0) ::fdatasync(sync_fd_);
    }
    lk.lock();
  }
}

}  // namespace ddp::rdzv
