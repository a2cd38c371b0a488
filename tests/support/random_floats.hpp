// Test inputs: n floats uniform in [-1, 1) from a seed, the same on every platform's run of a
// test (std::mt19937 is fully specified; the distribution is the library's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
