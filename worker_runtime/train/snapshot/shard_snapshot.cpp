// Sharded snapshots: shard files, the index and its commit, and reading a replicated or sharded
// snapshot at any world size (see shard_snapshot.hpp).
#include "shard_snapshot.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"
#include "snapshot_io.hpp"

namespace ddp::train {

using namespace detail;  // this file's own internals (snapshot_io.hpp)

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
  const std::size_t n = layout.shard_size;
  const std::string header =
      shard_header(layout.rank, layout.world, h.global_step, n, pieces, h.model).dump();
  return write_shard(file, header, h.global_step, params_shard, n, opt_state_shard, pieces,
                     "sharded snapshot " + file);
}

void commit_sharded_snapshot(const std::string& path, const SnapshotHeader& h,
                             const std::vector<LayerSlot>& slots, int world, int pieces,
                             const std::string& sharding,
                             const std::vector<std::uint64_t>& shard_checksums) {
  std::vector<std::string> headers;
  std::vector<std::size_t> floats;
  for (int q = 0; q < std::max(world, 0); ++q) {
    floats.push_back(ranged_size(even_ranges(slots, world, q)));
    headers.push_back(shard_header(q, world, h.global_step, floats.back(), pieces, h.model).dump());
  }
  commit_index(path, h, slots, world, pieces, sharding, shard_checksums, headers, floats,
               json::object());
}

void detail::commit_index(const std::string& path, const SnapshotHeader& h,
                          const std::vector<LayerSlot>& slots, int world, int pieces,
                          const std::string& sharding,
                          const std::vector<std::uint64_t>& shard_checksums,
                          const std::vector<std::string>& headers,
                          const std::vector<std::size_t>& floats, const json& extra) {
  const std::string what = "sharded snapshot " + path;
  if (world < 1 || pieces < 0 || shard_checksums.size() != static_cast<std::size_t>(world)) {
    throw ConfigError(what + ": " + std::to_string(shard_checksums.size()) +
                      " shard checksums for a world of " + std::to_string(world));
  }
  const fs::path dir = dir_of(path);
  const std::string base = fs::path(path).filename().string();
  json files = json::array();
  for (int q = 0; q < world; ++q) {
    const auto uq = static_cast<std::size_t>(q);
    const std::size_t bytes = file_bytes(headers[uq].size(), floats[uq], pieces);
    const std::string rel = shard_rel(base, h.global_step, q, world);
    const std::string full = (dir / rel).string();
    struct stat st {};
    if (::stat(full.c_str(), &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
      throw IoError(what + ": rank " + std::to_string(q) + "'s shard file " + full +
                    " is missing or not " + std::to_string(bytes) +
                    " bytes long (every rank must write to one shared folder)");
    }
    files.push_back({{"name", rel}, {"bytes", bytes}, {"fnv", shard_checksums[uq]}});
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
  for (const auto& [key, value] : extra.items()) j[key] = value;
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
  std::vector<FileRanges> ranges;  // empty: the even cut
  const bool ranged = c.header.contains("ranges");
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
      if (c.header.contains("layout")) r.layout_ = c.header.at("layout").dump();
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
    ShardFile whole{path, c.data_off, np, {}, {}};  // one "shard": the flat layout
    for (const LayerSlot& s : slots) {
      whole.local.push_back(s.w);
      whole.ranges.push_back({0, s.size()});
    }
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
  if (ranged) {
    ranges = ranges_from_json(c.header.at("ranges"), what);
    if (ranges.size() != files.size()) {
      throw ConfigError(what + ": \"ranges\" has " + std::to_string(ranges.size()) +
                        " entries for " + std::to_string(files.size()) + " shard files");
    }
    check_tiling(slots, ranges, what + ": \"ranges\"");
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
    f.ranges = ranged ? ranges[static_cast<std::size_t>(q)] : even_ranges(slots, world, q);
    f.shard_size = ranged_size(f.ranges);
    const std::string want = shard_header(q, world, h.global_step, f.shard_size, r.pieces_, h.model,
                                          ranged ? &f.ranges : nullptr)
                                 .dump();
    if (file_bytes(want.size(), f.shard_size, r.pieces_) != bytes) {
      throw ConfigError(fwhat + ": the index gives it " + std::to_string(bytes) + " bytes, its " +
                        std::to_string(f.shard_size) + " floats and " + std::to_string(r.pieces_) +
                        " optimizer pieces take " +
                        std::to_string(file_bytes(want.size(), f.shard_size, r.pieces_)));
    }
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
    if (sc.header != json::parse(want)) {
      throw ConfigError(fwhat + ": its header " + sc.header.dump() +
                        " does not match the index's " + want);
    }
    // Where slot k's part starts: slot 0 first in a ranged file, the flat layout's order (the
    // last layer first) in an even-cut one.
    f.local.resize(slots.size());
    for (std::size_t i = 0, at = 0; i < slots.size(); ++i) {
      const std::size_t k = ranged ? i : slots.size() - 1 - i;
      f.local[k] = at;
      at += f.ranges[k].size();
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
  // The files' ranges tile the slot (checked by open), in any order of the files.
  for (const ShardFile& f : files_) {
    const SlotRange& held = f.ranges[k];
    const std::size_t a = std::max(lo, held.lo);
    const std::size_t b = std::min(hi, held.hi);
    if (a < b) read_range(f, f.local[k] + (a - held.lo), b - a, params, opt, a - lo);
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
