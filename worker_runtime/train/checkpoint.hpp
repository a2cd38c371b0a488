// ddp-train's snapshots as the training loop sees them: what a run starts from and how one is
// written, for replicated and sharded engines alike.
//   - Start: the snapshot at --snapshot when there is one, replicated (DDPSNAP1) or sharded
//     (an index and one file per rank), written at any world size and any --sharding level;
//     else --seed's initialisation. A replicated engine gets it from rank 0 (broadcast, so nodes
//     need no shared folder); a sharded engine's ranks each read their own slices (so they
//     must see one folder, as torch's distributed checkpoints need).
//   - Save: rank 0 writes the replicated file; a sharded engine's ranks each write their shard
//     and rank 0 commits the index (collective: every rank saves at the same position).
#pragma once

#include <cstdint>
#include <optional>

#include "engine.hpp"
#include "options.hpp"
#include "trainer.hpp"

namespace ddp::train {

// Where the job stands between optimizer steps: what a snapshot records.
struct Position {
  std::int64_t epoch = 0;
  std::int64_t step = 0;  // next micro-batch in the epoch
  std::int64_t global_step = 0;
  bool operator==(const Position& o) const {
    return epoch == o.epoch && step == o.step && global_step == o.global_step;
  }
};

// Collective. Sets the engine's parameters and optimizer state on every rank (uploading them);
// returns the snapshot's position, or nullopt for a fresh start from the seed. Throws
// ConfigError naming the file when the snapshot holds another model or optimizer, or is bad.
std::optional<Position> load_or_init(Engine& engine, const TrainOptions& o, const TrainContext& c);

// Writes the snapshot at `at` (the engine's current parameters and state). Replicated engines:
// rank 0 only (others return at once). Sharded engines: collective.
void save_snapshot(Engine& engine, const TrainOptions& o, const TrainContext& c,
                   const Position& at);

// The optimizer state's arrays per parameter: 0 (SGD), 1 (SGD with momentum), 2 (Adam's m
// and v, Adadelta's two averages).
int state_pieces(const Optimizer& opt);

}  // namespace ddp::train
