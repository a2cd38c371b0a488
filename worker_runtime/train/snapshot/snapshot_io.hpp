// Internals shared by shard_snapshot.cpp and shard_ranges.cpp (not a public header): the
// magics, the shard file's header, folder creation, checked preads of a snapshot file and the
// atomic write of a shard. commit_index is defined in shard_snapshot.cpp, the ranges' JSON in
// shard_ranges.cpp.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/proto/error.hpp"
#include "model.hpp"
#include "shard_ranges.hpp"
#include "snapshot.hpp"

namespace ddp::train::detail {

namespace fs = std::filesystem;
using nlohmann::json;

// A file's ranges as JSON (shard_ranges.cpp): per slot, [lo, hi]; the index's "ranges" is an
// array of them, one per file. ranges_from_json throws ConfigError "<what>: ..." when the
// shape is wrong (not when the ranges do not tile: check_tiling).
json file_ranges_json(const FileRanges& ranges);
std::vector<FileRanges> ranges_from_json(const json& j, const std::string& what);

inline constexpr char kSnapMagic[8] = {'D', 'D', 'P', 'S', 'N', 'A', 'P', '1'};
inline constexpr char kIndexMagic[8] = {'D', 'D', 'P', 'S', 'I', 'D', 'X', '1'};
inline constexpr char kShardMagic[8] = {'D', 'D', 'P', 'S', 'H', 'R', 'D', '1'};
inline constexpr std::size_t kPrefix = 12;  // the magic and the u32 header length
inline constexpr std::size_t kTrailer = 8;

inline std::string le_bytes(std::uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}
inline std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<std::uint8_t>(p[i])} << (8 * i);
  return v;
}
inline std::string_view float_bytes(const float* p, std::size_t n) {
  return n == 0 ? std::string_view() : std::string_view(reinterpret_cast<const char*>(p), n * 4);
}

// The shard file's JSON header; a ranged file's also names its ranges (one per slot).
inline json shard_header(int rank, int world, std::int64_t global_step, std::size_t params,
                         int pieces, const std::string& model, const FileRanges* ranges = nullptr) {
  json j{{"rank", rank},     {"world", world},   {"global_step", global_step},
         {"params", params}, {"pieces", pieces}, {"model", model}};
  if (ranges != nullptr) j["ranges"] = file_ranges_json(*ranges);
  return j;
}
inline std::size_t file_bytes(std::size_t header_len, std::size_t floats, int pieces) {
  return kPrefix + header_len + 4 * floats * (1 + static_cast<std::size_t>(pieces)) + kTrailer;
}
inline std::string shard_rel(const std::string& base, std::int64_t global_step, int rank,
                             int world) {
  return base + ".shards/step-" + std::to_string(global_step) + "/rank-" + std::to_string(rank) +
         "-of-" + std::to_string(world) + ".bin";
}
inline fs::path dir_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

// mkdir -p, tolerating ranks that create the same folders at once; fsyncs a new folder's parent.
inline void make_dirs(const fs::path& dir, const std::string& what) {
  fs::path cur;
  for (const fs::path& part : dir) {
    cur /= part;
    if (::mkdir(cur.c_str(), 0755) == 0) {
      const fs::path parent = cur.has_parent_path() ? cur.parent_path() : fs::path(".");
      if (int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
      }
    } else if (errno != EEXIST || !fs::is_directory(cur)) {
      throw IoError(what + ": cannot create the folder " + cur.string() + ": " +
                    std::strerror(errno));
    }
  }
}

// Writes a shard file atomically (creating its folders): the header, the n parameters, then
// `pieces` arrays of n floats of optimizer state. Returns its FNV-1a 64 trailer.
inline std::uint64_t write_shard(const std::string& file, const std::string& header,
                                 std::int64_t global_step, const float* params, std::size_t n,
                                 const float* opt_state, int pieces, const std::string& what) {
  if (pieces < 0 || global_step < 0 || (n > 0 && params == nullptr) ||
      (n > 0 && pieces > 0 && opt_state == nullptr)) {
    throw ConfigError(what + ": bad arguments (negative pieces or global_step, or no buffers)");
  }
  make_dirs(fs::path(file).parent_path(), what);
  const std::string head = std::string(kShardMagic, 8) + le_bytes(header.size(), 4) + header;
  const std::string_view p = float_bytes(params, n);
  const std::string_view state = float_bytes(opt_state, n * static_cast<std::size_t>(pieces));
  std::uint64_t fnv = fnv1a64(head.data(), head.size());
  fnv = fnv1a64(p.data(), p.size(), fnv);
  fnv = fnv1a64(state.data(), state.size(), fnv);
  const std::string trailer = le_bytes(fnv, 8);
  write_file_atomically(file, {head, p, state, trailer}, what);
  return fnv;
}

struct Fd {  // a file opened for reading, closed at the end of the scope
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~Fd() { ::close(fd); }  // -1: EBADF, harmless
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int fd;
};

// n bytes at off; a file that ends early is a ConfigError naming `what`.
inline void pread_exact(int fd, void* buf, std::size_t n, std::size_t off,
                        const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(what + ": read failed: " + std::strerror(errno));
    if (r == 0) throw ConfigError(what + ": the file ends early (truncated)");
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::size_t>(r);
  }
}

// An opened, checked file: magic, trailer (streamed once, constant memory) and JSON header.
struct Checked {
  std::size_t size = 0;
  std::uint64_t fnv = 0;
  std::size_t data_off = 0;
  json header;
};
// want_size: the size the index gives (0: any).
inline Checked check_file(int fd, const char* magic, std::size_t want_size,
                          const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(what + ": fstat failed: " + std::strerror(errno));
  Checked c;
  c.size = static_cast<std::size_t>(st.st_size);
  if (want_size != 0 && c.size != want_size) {
    throw ConfigError(what + ": holds " + std::to_string(c.size) + " bytes, the index says " +
                      std::to_string(want_size) + " (truncated or of another save)");
  }
  char head[kPrefix];
  if (c.size < kPrefix + kTrailer) throw ConfigError(what + ": too short to be a snapshot file");
  pread_exact(fd, head, kPrefix, 0, what);
  if (std::memcmp(head, magic, 8) != 0) {
    throw ConfigError(what + ": not a " + std::string(magic, 8) + " file (bad magic)");
  }
  std::vector<char> buf(std::size_t{1} << 20);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t off = 0; off < c.size - kTrailer;) {
    const std::size_t n = std::min(buf.size(), c.size - kTrailer - off);
    pread_exact(fd, buf.data(), n, off, what);
    h = fnv1a64(buf.data(), n, h);
    off += n;
  }
  char tail[kTrailer];
  pread_exact(fd, tail, kTrailer, c.size - kTrailer, what);
  c.fnv = get_le(tail, 8);
  if (h != c.fnv) throw ConfigError(what + ": checksum mismatch (truncated or corrupt file)");
  const std::size_t hlen = get_le(head + 8, 4);
  if (kPrefix + hlen + kTrailer > c.size) {
    throw ConfigError(what + ": header length " + std::to_string(hlen) + " runs past the end");
  }
  std::string text(hlen, '\0');
  pread_exact(fd, text.data(), hlen, kPrefix, what);
  try {
    c.header = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(what + ": bad header: " + e.what());
  }
  c.data_off = kPrefix + hlen;
  return c;
}

// Rank 0's commit (shard_snapshot.cpp): checks that file q is there with header headers[q]
// and floats[q] parameters, writes the index (the replicated header's fields, world_size,
// sharding, pieces, params, slots, files, then `extra`'s keys) atomically, and removes the
// other steps' folders and this step's files of another world size.
void commit_index(const std::string& path, const SnapshotHeader& h,
                  const std::vector<LayerSlot>& slots, int world, int pieces,
                  const std::string& sharding, const std::vector<std::uint64_t>& shard_checksums,
                  const std::vector<std::string>& headers, const std::vector<std::size_t>& floats,
                  const json& extra);

}  // namespace ddp::train::detail
