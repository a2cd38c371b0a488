// Which elements of the model a rank holds under sharding (FSDP / ZeRO): every layer's slot
// (weight then bias, model.hpp) is cut into `world` parts as even as can be
// (worker::even_shards: the first size % world ranks get one more), and rank r holds part r of
// every slot. Its shard buffer is those parts one after another in the flat layout's order
// (the last layer first), so the shard of the parameters, of the gradients and of each piece of
// optimizer state line up element for element. Pure: no communication, no allocation beyond
// the tables.
#pragma once

#include <cstddef>
#include <vector>

#include "model.hpp"

namespace ddp::train {

// --sharding (options.hpp names them): ZeRO's stages, FSDP's sharding strategies.
//   none       replicated (DDP; FSDP NO_SHARD)
//   optimizer  optimizer state sharded (ZeRO-1)
//   gradients  + gradients reduce-scattered, each rank keeps its shard (ZeRO-2; SHARD_GRAD_OP)
//   full       + parameters sharded, gathered per layer just before use (ZeRO-3; FULL_SHARD)
enum class Sharding { none, optimizer, gradients, full };

struct ShardLayout {
  int world = 1;
  int rank = 0;
  std::vector<LayerSlot> slots;                  // the whole model's layout
  std::vector<std::vector<std::size_t>> counts;  // counts[k][q]: rank q's part of slot k
  std::vector<std::size_t> lo;                   // this rank's part of slot k: [lo[k], hi[k])
  std::vector<std::size_t> hi;                   //   within the slot (0 = the slot's start)
  std::vector<std::size_t> local;  // where that part starts in this rank's shard buffer
  std::size_t shard_size = 0;      // floats in this rank's shard buffer
  std::size_t total = 0;           // floats in the whole model

  std::size_t part(std::size_t k) const { return hi[k] - lo[k]; }
};

// Throws ConfigError when world < 1 or rank is outside [0, world).
ShardLayout make_shard_layout(const std::vector<LayerSlot>& slots, int world, int rank);

}  // namespace ddp::train
