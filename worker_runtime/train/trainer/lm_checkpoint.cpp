// Snapshots of the language model on a dp x tp mesh (lm_checkpoint.hpp).
#include "lm_checkpoint.hpp"

#include <exception>
#include <nlohmann/json.hpp>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "shard_ranges.hpp"
#include "shard_snapshot.hpp"
#include "trainer.hpp"

namespace ddp::train {
namespace {

nlohmann::json lm_sizes(const LmConfig& c) {
  return {{"vocab", c.vocab},     {"dim", c.dim},   {"n_layers", c.n_layers},
          {"n_heads", c.n_heads}, {"ffn", c.ffn()}, {"tied", c.tied}};
}

SnapshotHeader header_at(std::int64_t adam_t, const TrainOptions& o, const TrainContext& c,
                         const Position& at) {
  SnapshotHeader h;
  h.model = to_string(ModelKind::llama);
  h.optimizer = to_string(o.optimizer.kind);
  h.epoch = at.epoch;
  h.step = at.step;
  h.global_step = at.global_step;
  h.adam_t = adam_t;
  h.seed = o.seed;
  h.lr = o.optimizer.lr;
  h.world_size = c.world;
  h.batch_size = o.batch_size;
  return h;
}

}  // namespace

std::vector<LayerSlot> lm_slots(const LmConfig& c) {
  std::vector<LayerSlot> slots;
  std::size_t off = 0;
  for (const LmTensor& t : lm_tensors(c)) {
    slots.push_back({off, off + t.size(), off + t.size()});
    off += t.size();
  }
  return slots;
}

std::string lm_layout_json(const LmConfig& c, MeshShape shape) {
  const nlohmann::json j = {
      {"mesh", "dp=" + std::to_string(shape.dp) + ",tp=" + std::to_string(shape.tp)},
      {"lm", lm_sizes(c)}};
  return j.dump();
}

std::optional<Position> lm_load_or_init(LmEngine& e, const TrainOptions& o, const TrainContext& c) {
  const LmConfig& cfg = e.config();
  std::optional<SnapshotReader> r;
  if (!o.snapshot.empty()) r = SnapshotReader::open(o.snapshot, lm_slots(cfg));
  // Every rank must agree on whether there is one (a folder only some nodes see is an error).
  std::int32_t have = r.has_value() ? 1 : 0;
  if (c.comm != nullptr && c.world > 1) {
    std::vector<std::int32_t> all(static_cast<std::size_t>(c.world));
    c.comm->all_gather(&have, all.data(), sizeof have);
    for (std::size_t q = 0; q < all.size(); ++q) {
      if (all[q] != have) {
        throw ConfigError("snapshot " + o.snapshot + ": rank " + std::to_string(q) +
                          (all[q] != 0 ? " sees it and rank " : " does not see it but rank ") +
                          std::to_string(c.rank) + (have != 0 ? " does" : " does not") +
                          "; every rank reads its own part, so it must be in a folder every node "
                          "sees");
      }
    }
  }
  if (!r) {
    e.init(o.seed);
    return std::nullopt;
  }
  const SnapshotHeader& h = r->header();
  if (h.model != to_string(ModelKind::llama)) {
    throw ConfigError("snapshot " + o.snapshot + " holds a " + h.model +
                      " model, not llama (another --snapshot path starts afresh)");
  }
  if (!r->layout().empty()) {
    const auto saved = nlohmann::json::parse(r->layout(), nullptr, false);
    if (saved.is_discarded() || !saved.contains("lm") || saved["lm"] != lm_sizes(cfg)) {
      throw ConfigError(
          "snapshot " + o.snapshot + " holds a llama of sizes " +
          (saved.is_discarded() ? std::string("?") : saved.value("lm", nlohmann::json()).dump()) +
          ", not " + lm_sizes(cfg).dump());
    }
  }
  const int want = state_pieces(e.optimizer());
  if (r->pieces() != want || h.optimizer != to_string(o.optimizer.kind)) {
    throw ConfigError("snapshot " + o.snapshot + " was written with --optimizer " + h.optimizer +
                      ", this run uses " + to_string(o.optimizer.kind));
  }
  e.load(*r, true);
  e.optimizer().set_steps(h.adam_t);
  return Position{h.epoch, h.step, h.global_step};
}

void lm_save(LmEngine& e, const TrainOptions& o, const TrainContext& c, const MeshPlace& place,
             const Position& at) {
  if (o.snapshot.empty()) return;
  const LmConfig& cfg = e.config();
  const SnapshotHeader h = header_at(e.optimizer().steps(), o, c, at);
  const std::vector<LayerSlot> slots = lm_slots(cfg);
  const int pieces = state_pieces(e.optimizer());
  const MeshShape shape = place.shape;
  const auto r = static_cast<std::size_t>(c.rank);
  const FileRanges mine = lm_owned_ranges(cfg, shape.dp, shape.tp, place.dp[r], place.tp[r]);
  const std::size_t n = ranged_size(mine);
  std::vector<float> params(n);
  std::vector<float> opt(n * static_cast<std::size_t>(pieces));
  e.owned(params.data(), pieces > 0 ? opt.data() : nullptr, pieces);
  const std::uint64_t sum =
      write_ranged_shard_file(o.snapshot, h, c.rank, c.world, slots, mine, params.data(),
                              pieces > 0 ? opt.data() : nullptr, pieces);
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(c.world), sum);
  if (c.comm != nullptr && c.world > 1) c.comm->all_gather(&sum, sums.data(), sizeof sum);
  commit_on_rank0(
      c,
      [&] {
        std::vector<FileRanges> all;
        for (std::size_t q = 0; q < static_cast<std::size_t>(c.world); ++q) {
          all.push_back(lm_owned_ranges(cfg, shape.dp, shape.tp, place.dp[q], place.tp[q]));
        }
        commit_ranged_snapshot(o.snapshot, h, slots, c.world, pieces, to_string(e.sharding()), all,
                               lm_layout_json(cfg, shape), sums);
      },
      "snapshot " + o.snapshot);
}

}  // namespace ddp::train
