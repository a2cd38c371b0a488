// The shard layout (see shard_layout.hpp).
#include "shard_layout.hpp"

#include <string>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"

namespace ddp::train {

ShardLayout make_shard_layout(const std::vector<LayerSlot>& slots, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ConfigError("shard layout: rank " + std::to_string(rank) + " of a world of " +
                      std::to_string(world));
  }
  ShardLayout s;
  s.world = world;
  s.rank = rank;
  s.slots = slots;
  const std::size_t nl = slots.size();
  s.counts.resize(nl);
  s.lo.resize(nl);
  s.hi.resize(nl);
  s.local.resize(nl);
  for (std::size_t k = nl; k-- > 0;) {  // the flat layout's order: the last layer first
    s.counts[k] = worker::even_shards(slots[k].size(), world);
    const auto off = worker::shard_offsets("shard layout", s.counts[k], world);
    s.lo[k] = off[static_cast<std::size_t>(rank)];
    s.hi[k] = off[static_cast<std::size_t>(rank) + 1];
    s.local[k] = s.shard_size;
    s.shard_size += s.hi[k] - s.lo[k];
    s.total += slots[k].size();
  }
  return s;
}

}  // namespace ddp::train
