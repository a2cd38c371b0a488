// Ranged shard files: the tiling check, the ranges as JSON, writing a ranged shard and
// committing its index (see shard_ranges.hpp; reading is SnapshotReader's).
#include "shard_ranges.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "shard_snapshot.hpp"
#include "snapshot_io.hpp"

namespace ddp::train {
namespace {

using nlohmann::json;

std::string range_text(std::size_t lo, std::size_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
}

// One file's ranges against the slots: one per slot, inside it.
void check_file_ranges(const std::vector<LayerSlot>& slots, const FileRanges& ranges,
                       std::size_t rank, const std::string& what) {
  if (ranges.size() != slots.size()) {
    throw ConfigError(what + ": rank " + std::to_string(rank) + " has " +
                      std::to_string(ranges.size()) + " ranges for " +
                      std::to_string(slots.size()) + " slots");
  }
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const SlotRange& r = ranges[k];
    if (r.lo > r.hi || r.hi > slots[k].size()) {
      throw ConfigError(what + ": slot " + std::to_string(k) + ": rank " + std::to_string(rank) +
                        "'s range " + range_text(r.lo, r.hi) + " is not within the slot's " +
                        std::to_string(slots[k].size()) + " elements");
    }
  }
}

}  // namespace

std::size_t ranged_size(const FileRanges& ranges) {
  std::size_t n = 0;
  for (const SlotRange& r : ranges) n += r.size();
  return n;
}

FileRanges even_ranges(const std::vector<LayerSlot>& slots, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ConfigError("even_ranges: rank " + std::to_string(rank) + " of a world of " +
                      std::to_string(world));
  }
  const auto w = static_cast<std::size_t>(world);
  const auto q = static_cast<std::size_t>(rank);
  FileRanges out;
  for (const LayerSlot& s : slots) {
    const std::size_t n = s.size();
    const std::size_t lo = q * (n / w) + std::min(q, n % w);
    out.push_back({lo, lo + n / w + (q < n % w ? 1 : 0)});
  }
  return out;
}

void check_tiling(const std::vector<LayerSlot>& slots, const std::vector<FileRanges>& ranges,
                  const std::string& what) {
  if (ranges.empty()) throw ConfigError(what + ": no ranks' ranges");
  for (std::size_t q = 0; q < ranges.size(); ++q) check_file_ranges(slots, ranges[q], q, what);
  struct Held {
    SlotRange r;
    std::size_t rank;
  };
  std::vector<Held> held;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    held.clear();
    for (std::size_t q = 0; q < ranges.size(); ++q) {
      if (ranges[q][k].size() > 0) held.push_back({ranges[q][k], q});
    }
    std::sort(held.begin(), held.end(),
              [](const Held& a, const Held& b) { return a.r.lo < b.r.lo; });
    const std::string slot = what + ": slot " + std::to_string(k) + " (" +
                             std::to_string(slots[k].size()) + " elements): elements ";
    std::size_t at = 0;  // covered: [0, at), the last part by rank `last`
    std::size_t last = 0;
    for (const Held& h : held) {
      if (h.r.lo > at) throw ConfigError(slot + range_text(at, h.r.lo) + " are held by no rank");
      if (h.r.lo < at) {
        throw ConfigError(slot + range_text(h.r.lo, std::min(at, h.r.hi)) +
                          " are held by both rank " + std::to_string(last) + " and rank " +
                          std::to_string(h.rank));
      }
      at = h.r.hi;
      last = h.rank;
    }
    if (at < slots[k].size()) {
      throw ConfigError(slot + range_text(at, slots[k].size()) + " are held by no rank");
    }
  }
}

namespace detail {

json file_ranges_json(const FileRanges& ranges) {
  json out = json::array();
  for (const SlotRange& r : ranges) out.push_back({r.lo, r.hi});
  return out;
}

std::vector<FileRanges> ranges_from_json(const json& j, const std::string& what) {
  const std::string bad = what + ": \"ranges\" is not a list, per file, of [lo, hi] per slot";
  if (!j.is_array()) throw ConfigError(bad);
  std::vector<FileRanges> out;
  for (const json& file : j) {
    if (!file.is_array()) throw ConfigError(bad);
    FileRanges& f = out.emplace_back();
    for (const json& r : file) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() ||
          !r[1].is_number_unsigned()) {
        throw ConfigError(bad + " (file " + std::to_string(out.size() - 1) + ": " + r.dump() + ")");
      }
      f.push_back({r[0].get<std::size_t>(), r[1].get<std::size_t>()});
    }
  }
  return out;
}

}  // namespace detail

std::uint64_t write_ranged_shard_file(const std::string& path, const SnapshotHeader& h, int rank,
                                      int world, const std::vector<LayerSlot>& slots,
                                      const FileRanges& ranges, const float* params,
                                      const float* opt_state, int pieces) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ConfigError("sharded snapshot " + path + ": rank " + std::to_string(rank) +
                      " of a world of " + std::to_string(world));
  }
  const std::string file = shard_file_path(path, h.global_step, rank, world);
  const std::string what = "sharded snapshot " + file;
  check_file_ranges(slots, ranges, static_cast<std::size_t>(rank), what);
  const std::size_t n = ranged_size(ranges);
  const std::string header =
      detail::shard_header(rank, world, h.global_step, n, pieces, h.model, &ranges).dump();
  return detail::write_shard(file, header, h.global_step, params, n, opt_state, pieces, what);
}

void commit_ranged_snapshot(const std::string& path, const SnapshotHeader& h,
                            const std::vector<LayerSlot>& slots, int world, int pieces,
                            const std::string& sharding, const std::vector<FileRanges>& ranges,
                            const std::string& layout_json,
                            const std::vector<std::uint64_t>& shard_checksums) {
  const std::string what = "sharded snapshot " + path;
  if (world < 1 || ranges.size() != static_cast<std::size_t>(world)) {
    throw ConfigError(what + ": ranges of " + std::to_string(ranges.size()) +
                      " ranks for a world of " + std::to_string(world));
  }
  check_tiling(slots, ranges, what);
  json extra = json::object();
  json& all = extra["ranges"] = json::array();
  std::vector<std::string> headers;
  std::vector<std::size_t> floats;
  for (int q = 0; q < world; ++q) {
    const FileRanges& r = ranges[static_cast<std::size_t>(q)];
    all.push_back(detail::file_ranges_json(r));
    floats.push_back(ranged_size(r));
    headers.push_back(
        detail::shard_header(q, world, h.global_step, floats.back(), pieces, h.model, &r).dump());
  }
  if (!layout_json.empty()) {
    try {
      extra["layout"] = json::parse(layout_json);
    } catch (const json::exception& e) {
      throw ConfigError(what + ": the layout is not JSON: " + e.what());
    }
  }
  detail::commit_index(path, h, slots, world, pieces, sharding, shard_checksums, headers, floats,
                       extra);
}

}  // namespace ddp::train
