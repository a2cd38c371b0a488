// Sharded snapshots: shard files, the index and its commit, and reading a replicated or sharded
// snapshot at any world size (see shard_snapshot.hpp).
#include "shard_snapshot.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kSnapMagic[8] = {'D', 'D', 'P', 'S', 'N', 'A', 'P', '1'};
constexpr char kIndexMagic[8] = {'D', 'D', 'P', 'S', 'I', 'D', 'X', '1'};
constexpr char kShardMagic[8] = {'D', 'D', 'P', 'S', 'H', 'R', 'D', '1'};
constexpr std::size_t kPrefix = 12;  // the magic and the u32 header length
constexpr std::size_t kTrailer = 8;

// Rank q's part of a slot of s elements cut into w parts, as worker::even_shards cuts it.
std::size_t part_count(std::size_t s, std::size_t w, std::size_t q) {
  return s / w + (q < s % w ? 1 : 0);
}
std::size_t part_offset(std::size_t s, std::size_t w, std::size_t q) {
  return q * (s / w) + std::min(q, s % w);
}
std::size_t part_of(std::size_t s, std::size_t w, std::size_t i) {  // the part holding i < s
  const std::size_t base = s / w;
  const std::size_t big = (s % w) * (base + 1);  // elements in the parts with one more
  return i < big ? i / (base + 1) : s % w + (i - big) / base;
}
std::size_t shard_size_of(const std::vector<LayerSlot>& slots, int world, int rank) {
  std::size_t n = 0;
  for (const LayerSlot& s : slots) {
    n += part_count(s.size(), static_cast<std::size_t>(world), static_cast<std::size_t>(rank));
  }
  return n;
}

std::string le_bytes(std::uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}
std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<std::uint8_t>(p[i])} << (8 * i);
  return v;
}
std::string_view float_bytes(const float* p, std::size_t n) {
  return n == 0 ? std::string_view() : std::string_view(reinterpret_cast<const char*>(p), n * 4);
}

std::string shard_header(int rank, int world, std::int64_t global_step, std::size_t params,
                         int pieces, const std::string& model) {
  return json{{"rank", rank},     {"world", world},   {"global_step", global_step},
              {"params", params}, {"pieces", pieces}, {"model", model}}
      .dump();
}
std::size_t file_bytes(std::size_t header_len, std::size_t floats, int pieces) {
  return kPrefix + header_len + 4 * floats * (1 + static_cast<std::size_t>(pieces)) + kTrailer;
}
std::string shard_rel(const std::string& base, std::int64_t global_step, int rank, int world) {
  return base + ".shards/step-" + std::to_string(global_step) + "/rank-" + std::to_string(rank) +
         "-of-" + std::to_string(world) + ".bin";
}
fs::path dir_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

// mkdir -p, tolerating ranks that create the same folders at once; fsyncs a new folder's parent.
void make_dirs(const fs::path& dir, const std::string& what) {
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

struct Fd {  // a file opened for reading, closed at the end of the scope
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~Fd() { ::close(fd); }  // -1: EBADF, harmless
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int fd;
};

// n bytes at off; a file that ends early is a ConfigError naming `what`.
void pread_exact(int fd, void* buf, std::size_t n, std::size_t off, const std::string& what) {
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
Checked check_file(int fd, const char* magic, std::size_t want_size, const std::string& what) {
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

}  // namespace

std::string shard_file_path(const std::string& path, std::int64_t global_step, int rank,
                            int world) {
  const fs::path p(path);
  const std::string rel = shard_rel(p.filename().string(), global_step, rank, world);
  return p.has_parent_path() ? (p.parent_path() / rel).string() : rel;
}

std::uint64_t write_shard_file(const std::string& path, const SnapshotHeader& h,
                               const ShardLayout& layout, const float* params_shard,
                               const float* opt_state_shard, int pieces) {
  const std::string file = shard_file_path(path, h.global_step, layout.rank, layout.world);
  const std::string what = "sharded snapshot " + file;
  const std::size_t n = layout.shard_size;
  if (pieces < 0 || h.global_step < 0 || (n > 0 && params_shard == nullptr) ||
      (n > 0 && pieces > 0 && opt_state_shard == nullptr)) {
    throw ConfigError(what + ": bad arguments (negative pieces or global_step, or no buffers)");
  }
  make_dirs(fs::path(file).parent_path(), what);
  const std::string header =
      shard_header(layout.rank, layout.world, h.global_step, n, pieces, h.model);
  const std::string head = std::string(kShardMagic, 8) + le_bytes(header.size(), 4) + header;
  const std::string_view params = float_bytes(params_shard, n);
  const std::string_view state = float_bytes(opt_state_shard, n * static_cast<std::size_t>(pieces));
  std::uint64_t fnv = fnv1a64(head.data(), head.size());
  fnv = fnv1a64(params.data(), params.size(), fnv);
  fnv = fnv1a64(state.data(), state.size(), fnv);
  const std::string trailer = le_bytes(fnv, 8);
  write_file_atomically(file, {head, params, state, trailer}, what);
  return fnv;
}

void commit_sharded_snapshot(const std::string& path, const SnapshotHeader& h,
                             const std::vector<LayerSlot>& slots, int world, int pieces,
                             const std::string& sharding,
                             const std::vector<std::uint64_t>& shard_checksums) {
  const std::string what = "sharded snapshot " + path;
  if (world < 1 || pieces < 0 || shard_checksums.size() != static_cast<std::size_t>(world)) {
    throw ConfigError(what + ": " + std::to_string(shard_checksums.size()) +
                      " shard checksums for a world of " + std::to_string(world));
  }
  const fs::path dir = dir_of(path);
  const std::string base = fs::path(path).filename().string();
  json files = json::array();
  for (int q = 0; q < world; ++q) {
    const std::size_t n = shard_size_of(slots, world, q);
    const std::size_t bytes =
        file_bytes(shard_header(q, world, h.global_step, n, pieces, h.model).size(), n, pieces);
    const std::string rel = shard_rel(base, h.global_step, q, world);
    const std::string full = (dir / rel).string();
    struct stat st {};
    if (::stat(full.c_str(), &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
      throw IoError(what + ": rank " + std::to_string(q) + "'s shard file " + full +
                    " is missing or not " + std::to_string(bytes) +
                    " bytes long (every rank must write to one shared folder)");
    }
    files.push_back(
        {{"name", rel}, {"bytes", bytes}, {"fnv", shard_checksums[static_cast<std::size_t>(q)]}});
  }
  json j = header_json(h);
  j["world_size"] = world;
  j["sharding"] = sharding;
  j["pieces"] = pieces;
  std::vector<std::size_t> sizes;  // forward layer order
  for (const LayerSlot& s : slots) sizes.push_back(s.size());
  j["params"] = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  j["slots"] = sizes;
  j["files"] = files;
  const std::string header = j.dump();
  const std::string head = std::string(kIndexMagic, 8) + le_bytes(header.size(), 4) + header;
  const std::string trailer = le_bytes(fnv1a64(head.data(), head.size()), 8);
  write_file_atomically(path, {head, trailer}, what);  // the commit point

  // Best effort from here: what is left over is removed by the next commit.
  const fs::path shards = dir / (base + ".shards");
  const std::string keep = "step-" + std::to_string(h.global_step);
  const std::string own = "-of-" + std::to_string(world) + ".bin";
  std::vector<fs::path> doomed;
  std::error_code ec;
  for (fs::directory_iterator it(shards, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step-", 0) == 0 && name != keep) doomed.push_back(it->path());
  }
  // This step saved before at another world size (a resumed run saving at once).
  for (fs::directory_iterator it(shards / keep, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank-", 0) == 0 && name.find(own) == std::string::npos) {
      doomed.push_back(it->path());
    }
  }
  for (const fs::path& p : doomed) fs::remove_all(p, ec);
}

std::optional<SnapshotReader> SnapshotReader::open(const std::string& path,
                                                   const std::vector<LayerSlot>& slots) {
  Fd fd(path);
  if (fd.fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw ConfigError("snapshot " + path + ": cannot be read: " + std::strerror(errno));
  }
  SnapshotReader r;
  r.path_ = path;
  r.slots_ = slots;
  for (const LayerSlot& s : slots) r.total_ += s.size();
  char magic[8] = {};
  r.sharded_ = ::pread(fd.fd, magic, 8, 0) == 8 && std::memcmp(magic, kIndexMagic, 8) == 0;
  if (!r.sharded_ && std::memcmp(magic, kSnapMagic, 8) != 0) {
    throw ConfigError("snapshot " + path +
                      ": not a ddp-train snapshot (no DDPSNAP1 or DDPSIDX1 magic)");
  }
  const std::string what = (r.sharded_ ? "sharded snapshot " : "snapshot ") + path;
  const Checked c = check_file(fd.fd, r.sharded_ ? kIndexMagic : kSnapMagic, 0, what);
  std::size_t np = 0;
  std::size_t ns = 0;
  std::vector<std::size_t> sizes;
  struct Entry {
    std::string name;
    std::size_t bytes;
    std::uint64_t fnv;
  };
  std::vector<Entry> files;
  try {
    r.header_ = header_from_json(c.header);
    np = c.header.at("params").get<std::size_t>();
    if (r.sharded_) {
      r.sharding_ = c.header.at("sharding").get<std::string>();
      r.pieces_ = c.header.at("pieces").get<int>();
      sizes = c.header.at("slots").get<std::vector<std::size_t>>();
      for (const json& e : c.header.at("files")) {
        files.push_back({e.at("name").get<std::string>(), e.at("bytes").get<std::size_t>(),
                         e.at("fnv").get<std::uint64_t>()});
      }
    } else {
      ns = c.header.at("opt_state").get<std::size_t>();
    }
  } catch (const json::exception& e) {
    throw ConfigError(what + ": bad header: " + e.what());
  }
  const SnapshotHeader& h = r.header_;
  if (h.epoch < 0 || h.step < 0 || h.global_step < 0 || h.world_size < 1 || r.pieces_ < 0) {
    throw ConfigError(what + ": negative epoch, step, global_step or pieces, or no world_size");
  }
  if (!r.sharded_) {
    const std::size_t body = c.size - c.data_off - kTrailer;
    if (np != r.total_ || body != (np + ns) * 4 || (np == 0 ? ns != 0 : ns % np != 0)) {
      throw ConfigError(what + ": the snapshot holds " + std::to_string(np) + " parameters and " +
                        std::to_string(ns) + " floats of optimizer state in " +
                        std::to_string(body) + " bytes, the model has " + std::to_string(r.total_) +
                        " parameters");
    }
    r.pieces_ = np > 0 ? static_cast<int>(ns / np) : 0;
    ShardFile whole{path, c.data_off, np, {}};  // one "shard": the flat layout
    for (const LayerSlot& s : slots) whole.local.push_back(s.w);
    r.files_.push_back(std::move(whole));
    return r;
  }
  if (sizes.size() != slots.size()) {
    throw ConfigError(what + ": the snapshot has " + std::to_string(sizes.size()) +
                      " layers, the model " + std::to_string(slots.size()));
  }
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (sizes[k] != slots[k].size()) {
      throw ConfigError(what + ": layer " + std::to_string(k) + " holds " +
                        std::to_string(sizes[k]) + " floats in the snapshot, " +
                        std::to_string(slots[k].size()) + " in the model");
    }
  }
  const int world = h.world_size;
  if (files.size() != static_cast<std::size_t>(world)) {
    throw ConfigError(what + ": world_size " + std::to_string(world) + " but " +
                      std::to_string(files.size()) + " shard files");
  }
  const fs::path dir = dir_of(path);
  for (int q = 0; q < world; ++q) {
    ShardFile f;
    const auto& [name, bytes, fnv] = files[static_cast<std::size_t>(q)];
    const std::string expect =
        "rank-" + std::to_string(q) + "-of-" + std::to_string(world) + ".bin";
    const fs::path rel(name);
    if (rel.is_absolute() || rel.filename() != expect) {
      throw ConfigError(what + ": shard file " + std::to_string(q) + " is named " + name +
                        ", not .../" + expect + " as world_size " + std::to_string(world) +
                        " wants");
    }
    f.path = (dir / rel).string();
    const std::string fwhat = what + ": shard file " + f.path;
    Fd sfd(f.path);
    if (sfd.fd < 0) {
      throw ConfigError(fwhat + (errno == ENOENT
                                     ? std::string(" is missing")
                                     : ": cannot be read: " + std::string(std::strerror(errno))));
    }
    const Checked sc = check_file(sfd.fd, kShardMagic, bytes, fwhat);
    if (sc.fnv != fnv) {
      throw ConfigError(fwhat + ": checksum differs from the index's (a file of another save)");
    }
    f.data_off = sc.data_off;
    f.shard_size = shard_size_of(slots, world, q);
    const std::string want =
        shard_header(q, world, h.global_step, f.shard_size, r.pieces_, h.model);
    if (sc.header != json::parse(want) ||
        file_bytes(want.size(), f.shard_size, r.pieces_) != bytes) {
      throw ConfigError(fwhat + ": its header " + sc.header.dump() +
                        " or size does not match the index's " + want);
    }
    f.local.resize(slots.size());
    for (std::size_t k = slots.size(), at = 0; k-- > 0;) {  // the flat layout's order
      f.local[k] = at;
      at += part_count(slots[k].size(), files.size(), static_cast<std::size_t>(q));
    }
    r.files_.push_back(std::move(f));
  }
  return r;
}

void SnapshotReader::read_range(const ShardFile& f, std::size_t first, std::size_t count,
                                float* params, const std::vector<float*>& opt,
                                std::size_t out_off) const {
  Fd fd(f.path);
  const std::string what =
      (sharded_ ? "sharded snapshot " + path_ + ": shard file " : "snapshot ") + f.path;
  if (fd.fd < 0) throw ConfigError(what + ": cannot be read: " + std::strerror(errno));
  pread_exact(fd.fd, params + out_off, count * 4, f.data_off + 4 * first, what);
  for (std::size_t j = 0; j < opt.size(); ++j) {  // piece j follows the parameters and j pieces
    pread_exact(fd.fd, opt[j] + out_off, count * 4,
                f.data_off + 4 * ((j + 1) * f.shard_size + first), what);
  }
}

void SnapshotReader::read(std::size_t k, std::size_t lo, std::size_t hi, float* params,
                          const std::vector<float*>& opt) const {
  if (k >= slots_.size() || lo > hi || hi > slots_[k].size() ||
      (!opt.empty() && opt.size() != static_cast<std::size_t>(pieces_))) {
    throw ConfigError("snapshot " + path_ + ": no [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + ") in layer " + std::to_string(k) + ", or not " +
                      std::to_string(pieces_) + " optimizer pieces");
  }
  if (lo == hi) return;
  const std::size_t s = slots_[k].size();
  const std::size_t w = files_.size();  // 1 when replicated: its one part is the whole slot
  for (std::size_t q = part_of(s, w, lo); q < w; ++q) {
    const std::size_t begin = part_offset(s, w, q);
    if (begin >= hi) break;
    const std::size_t a = std::max(lo, begin);
    const std::size_t b = std::min(hi, begin + part_count(s, w, q));
    if (a >= b) continue;
    read_range(files_[q], files_[q].local[k] + (a - begin), b - a, params, opt, a - lo);
  }
}

void SnapshotReader::read_shard(const ShardLayout& layout, float* params_shard,
                                float* opt_state_shard) const {
  if (layout.slots.size() != slots_.size() || layout.total != total_)
    throw ConfigError("snapshot " + path_ + ": the shard layout is of another model");
  std::vector<float*> opt(opt_state_shard != nullptr ? static_cast<std::size_t>(pieces_) : 0);
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    for (std::size_t j = 0; j < opt.size(); ++j) {
      opt[j] = opt_state_shard + j * layout.shard_size + layout.local[k];
    }
    read(k, layout.lo[k], layout.hi[k], params_shard + layout.local[k], opt);
  }
}

}  // namespace ddp::train
