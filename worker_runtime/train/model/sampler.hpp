// DistributedSampler's split of a dataset across ranks (shuffle=True, drop_last=False): a
// permutation seeded by seed + epoch, padded by repeating its start to a multiple of the world
// size; rank r takes positions r, r + W, r + 2W, ... Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp::train {

std::vector<std::uint32_t> shard_indices(std::size_t n, int world, int rank, std::uint64_t seed,
                                         std::uint64_t epoch, bool shuffle = true);

}  // namespace ddp::train
