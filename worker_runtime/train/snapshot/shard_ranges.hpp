// Ranged shard files (issue 20's tensor x data parallel mesh; format in docs/ddp_train.md
// "Sharded snapshots"): rank r holds, of every slot, any contiguous range [lo, hi) (possibly
// empty) rather than the even cut, the ranks' ranges tiling each slot exactly once. The files
// sit where shard_file_path puts them and commit like shard_snapshot.hpp's; the index adds
// "ranges" and "layout", and SnapshotReader reads both kinds at any world size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"
#include "snapshot.hpp"

namespace ddp::train {

struct SlotRange {
  std::size_t lo = 0, hi = 0;
  std::size_t size() const { return hi - lo; }
  bool operator==(const SlotRange&) const = default;
};
using FileRanges = std::vector<SlotRange>;  // one per slot

// Floats in a file holding `ranges`: the sum of their sizes.
std::size_t ranged_size(const FileRanges& ranges);

// The even cut as ranges: rank `rank` of `world`'s part of every slot (worker::even_shards).
FileRanges even_ranges(const std::vector<LayerSlot>& slots, int world, int rank);

// Pure. Throws ConfigError "<what>: ..." unless there is at least one file, every file has one
// range per slot with lo <= hi <= the slot's size, and every slot's non-empty ranges (in any
// order of files) cover it exactly once: a gap or an overlap names the slot, the elements and
// the ranks. Empty ranges may sit anywhere in the slot.
void check_tiling(const std::vector<LayerSlot>& slots, const std::vector<FileRanges>& ranges,
                  const std::string& what = "shard ranges");

// Each rank: writes its shard at shard_file_path(path, h.global_step, rank, world) atomically.
// params: the ranges' elements concatenated in slot order (slot 0 first), n = ranged_size
// floats; opt_state: `pieces` arrays of n floats (null when pieces is 0). Returns the file's
// FNV-1a 64 trailer for the commit. Throws ConfigError for bad arguments (ranges that do not
// fit the slots), IoError when the OS refuses.
std::uint64_t write_ranged_shard_file(const std::string& path, const SnapshotHeader& h, int rank,
                                      int world, const std::vector<LayerSlot>& slots,
                                      const FileRanges& ranges, const float* params,
                                      const float* opt_state, int pieces);

// Rank 0, once every rank has written its shard: checks that ranges (one per rank) tile every
// slot (ConfigError naming the slot), then commits like commit_sharded_snapshot; the index also
// holds "ranges" and, unless layout_json is empty, "layout" (layout_json parsed: any JSON, e.g.
// {"mesh":"dp=2,tp=2"}; ConfigError when it does not parse).
void commit_ranged_snapshot(const std::string& path, const SnapshotHeader& h,
                            const std::vector<LayerSlot>& slots, int world, int pieces,
                            const std::string& sharding, const std::vector<FileRanges>& ranges,
                            const std::string& layout_json,
                            const std::vector<std::uint64_t>& shard_checksums);

}  // namespace ddp::train
