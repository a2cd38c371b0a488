// ddp-train's sharded snapshot (FSDP / ZeRO; format in docs/ddp_train.md "Sharded snapshots"):
// every rank writes its shard (parameters and optimizer state) to its own file under
// `<path>.shards/step-<global_step>/`, then rank 0 writes the index at `path`, whose atomic
// rename is the commit point. SnapshotReader opens an index or a replicated snapshot
// (snapshot.hpp) and reads any slice of any layer, so a run can resume at another world size:
// it preads only the bytes asked for, never the whole file. A shard file holds either every
// slot's even cut or explicit ranges (shard_ranges.hpp: issue 20's mesh); the reader reads both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model.hpp"
#include "shard_layout.hpp"
#include "shard_ranges.hpp"
#include "snapshot.hpp"

namespace ddp::train {

// Where rank `rank` of `world` writes its shard for a snapshot at `path`:
// `<dir of path>/<basename of path>.shards/step-<global_step>/rank-<rank>-of-<world>.bin`.
std::string shard_file_path(const std::string& path, std::int64_t global_step, int rank, int world);

// Each rank: writes its shard atomically (creating the folders), `pieces` arrays of
// layout.shard_size floats of optimizer state after the parameters (opt_state_shard may be null
// when pieces is 0). Returns the file's FNV-1a 64 trailer, which rank 0 needs for the commit.
// Throws IoError when the OS refuses.
std::uint64_t write_shard_file(const std::string& path, const SnapshotHeader& h,
                               const ShardLayout& layout, const float* params_shard,
                               const float* opt_state_shard, int pieces);

// Rank 0, once every rank has written its shard (a barrier): writes the index at `path`
// atomically (the commit point), then removes the other `step-*` folders and, in this step's
// folder, the files of another world size. shard_checksums[r]: rank r's write_shard_file
// result. Throws IoError when a rank's file is not there as expected (the ranks must share the
// folder) or the OS refuses.
void commit_sharded_snapshot(const std::string& path, const SnapshotHeader& h,
                             const std::vector<LayerSlot>& slots, int world, int pieces,
                             const std::string& sharding,
                             const std::vector<std::uint64_t>& shard_checksums);

// Reads a replicated (DDPSNAP1) or a sharded (DDPSIDX1 index) snapshot at any world size.
class SnapshotReader {
 public:
  // nullopt when `path` does not exist. Checks everything once (magic, header, the slot sizes
  // against `slots`, a ranged index's ranges tiling every slot, every shard file's presence,
  // size, header and checksum, streamed in constant memory) and throws ConfigError naming the
  // file and what is wrong.
  static std::optional<SnapshotReader> open(const std::string& path,
                                            const std::vector<LayerSlot>& slots);

  const SnapshotHeader& header() const { return header_; }  // world_size: the writer's world
  bool sharded() const { return sharded_; }
  int pieces() const { return pieces_; }
  int world() const { return header_.world_size; }
  const std::string& sharding() const { return sharding_; }  // "none" when replicated
  // The index's "layout" as compact JSON (commit_ranged_snapshot's layout_json, keys sorted);
  // "" when absent (an even-cut or replicated snapshot).
  const std::string& layout() const { return layout_; }

  // Elements [lo, hi) of slot k: the parameters into params[0, hi - lo), optimizer piece j into
  // opt[j][0, hi - lo). opt empty: the state is skipped; otherwise it has pieces() entries.
  // Reads the overlapping part of every file holding some of them (even cut or ranged).
  void read(std::size_t k, std::size_t lo, std::size_t hi, float* params,
            const std::vector<float*>& opt) const;
  // This rank's whole shard under `layout`: params_shard and, unless opt_state_shard is null,
  // pieces() arrays of layout.shard_size floats.
  void read_shard(const ShardLayout& layout, float* params_shard, float* opt_state_shard) const;

 private:
  // A shard file, or the replicated file as the one shard of a world of 1.
  struct ShardFile {
    std::string path;
    std::size_t data_off = 0;        // bytes before the parameters
    std::size_t shard_size = 0;      // floats of parameters in the file (n of each piece)
    std::vector<std::size_t> local;  // where slot k's part starts among them
    FileRanges ranges;               // the part of slot k it holds: [lo, hi) within the slot
  };
  // count elements from element `first` of the file's parameters (and of each piece) into
  // params + out_off and opt[j] + out_off.
  void read_range(const ShardFile& f, std::size_t first, std::size_t count, float* params,
                  const std::vector<float*>& opt, std::size_t out_off) const;

  std::string path_;
  SnapshotHeader header_;
  bool sharded_ = false;
  int pieces_ = 0;
  std::string sharding_ = "none";
  std::string layout_;
  std::vector<LayerSlot> slots_;
  std::size_t total_ = 0;  // floats in the whole model
  std::vector<ShardFile> files_;
};

}  // namespace ddp::train
