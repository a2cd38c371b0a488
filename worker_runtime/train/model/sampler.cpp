// DistributedSampler semantics (see sampler.hpp).
#include "sampler.hpp"

#include <numeric>
#include <utility>

#include "data.hpp"

namespace ddp::train {

std::vector<std::uint32_t> shard_indices(std::size_t n, int world, int rank, std::uint64_t seed,
                                         std::uint64_t epoch, bool shuffle) {
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (shuffle) {
    SplitMix64 rng(seed + epoch);
    for (std::size_t i = n; i > 1; --i) {
      const std::size_t j = rng.next() % i;
      std::swap(order[i - 1], order[j]);
    }
  }
  const auto w = static_cast<std::size_t>(world);
  const std::size_t per_rank = (n + w - 1) / w;
  const std::size_t total = per_rank * w;
  for (std::size_t i = n; i < total && n > 0; ++i) order.push_back(order[i - n]);
  std::vector<std::uint32_t> mine;
  mine.reserve(per_rank);
  for (std::size_t i = static_cast<std::size_t>(rank); i < order.size(); i += w)
    mine.push_back(order[i]);
  return mine;
}

}  // namespace ddp::train
