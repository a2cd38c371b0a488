// Snapshots of the language model (--model llama) on a dp x tp mesh: every rank writes the
// elements it owns (lm_owned_ranges) as a ranged shard file, rank 0 commits the index with the
// mesh and the model's sizes under "layout"; a run on any other mesh (2x2 -> 1x2 -> 4x1) reads
// back its own tp part of every tensor and keeps what it holds. Format: docs/ddp_train.md
// "Sharded snapshots".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "lm_engine.hpp"
#include "mesh.hpp"
#include "model.hpp"

namespace ddp::train {

// One slot per canonical tensor (lm_tensors order), for the snapshot reader's checks.
std::vector<LayerSlot> lm_slots(const LmConfig& c);
// {"mesh": "dp=D,tp=T", "lm": {"vocab", "dim", "n_layers", "n_heads", "ffn", "tied"}}
std::string lm_layout_json(const LmConfig& c, MeshShape shape);

// Resumes from o.snapshot when it exists (any mesh, any sharding level; the model's sizes must
// match: ConfigError naming the difference), else draws the initial values from o.seed.
// Collective. Returns where to continue, or nullopt for a fresh start.
std::optional<Position> lm_load_or_init(LmEngine& e, const TrainOptions& o, const TrainContext& c);

// Collective: every rank writes its file, rank 0 commits and tells the others whether it could.
void lm_save(LmEngine& e, const TrainOptions& o, const TrainContext& c, const MeshPlace& place,
             const Position& at);

}  // namespace ddp::train
