// Layer slots of given sizes in ddp-train's flat layout (model.hpp: the last layer first), for the
// sharding and snapshot tests.
#pragma once

#include <cstddef>
#include <vector>

#include "shard_layout.hpp"

namespace ddp::test {

// Slots of the given sizes (forward order), each slot's bias at its middle.
inline std::vector<train::LayerSlot> slots_of(const std::vector<std::size_t>& sizes) {
  std::vector<train::LayerSlot> slots(sizes.size());
  std::size_t off = 0;
  for (std::size_t k = sizes.size(); k-- > 0;) {
    slots[k].w = off;
    slots[k].b = off + sizes[k] / 2;
    slots[k].end = off + sizes[k];
    off = slots[k].end;
  }
  return slots;
}

}  // namespace ddp::test
