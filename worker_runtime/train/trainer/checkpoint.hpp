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
#include <functional>
#include <string>
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

// In-place recovery, over the communicator rebuilt after a peer died (collective): every rank
// says the global step it holds (`mine`; nullopt: a replacement, holding nothing), and the
// lowest rank among those holding the newest sends its parameters, optimizer state and
// position to every rank, so all continue from one survivor's state (no disk read). Returns
// that position and the rank that sent it. Replicated engines only.
struct PeerState {
  Position at;
  int from = -1;
};
PeerState sync_from_peer(Engine& engine, worker::Communicator& comm, std::optional<Position> mine);

// Sharded engines' in-place recovery (shard_copies.hpp). keep_shard_copy: this rank's shard
// and its optimizer state at `at` become its own copy and go to its successor (collective).
// heal_shards, over the communicator rebuilt after a death (collective): every rank takes its
// shard at the last copy's step (a survivor its own copy, a replacement its successor's),
// then the copies are taken again. ProtocolError when a shard has no copy (then the job
// restarts from its last snapshot).
class ShardCopies;
void keep_shard_copy(Engine& engine, worker::Communicator& comm, ShardCopies& copies,
                     const Position& at);
PeerState heal_shards(Engine& engine, worker::Communicator& comm, ShardCopies& copies,
                      bool replacement);

// Writes the snapshot at `at` (the engine's current parameters and state). Replicated engines:
// rank 0 only (others return at once). Sharded engines: collective.
void save_snapshot(Engine& engine, const TrainOptions& o, const TrainContext& c,
                   const Position& at);

// Sharded saves, after every rank wrote its file: rank 0 runs `commit`, and every rank learns
// (a broadcast) whether it could, so none waits for or builds on a commit that failed. Rank 0
// rethrows its error; the others throw IoError naming `what`. Collective.
void commit_on_rank0(const TrainContext& c, const std::function<void()>& commit,
                     const std::string& what);

// The optimizer state's arrays per parameter: 0 (SGD), 1 (SGD with momentum), 2 (Adam's m
// and v, Adadelta's two averages).
int state_pieces(const Optimizer& opt);

}  // namespace ddp::train
