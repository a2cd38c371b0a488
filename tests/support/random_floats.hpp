// Random test inputs from a seed (std::mt19937 is fully specified; the distributions are the
// library's): n floats uniform in [-1, 1), and a batch of pixels in [0, 1) with labels 0-9.
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

struct Batch {
  std::vector<float> x;
  std::vector<std::uint8_t> labels;
};

inline Batch random_batch(std::size_t rows, std::size_t in, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Batch b;
  b.x.resize(rows * in);
  for (auto& v : b.x) v = u(rng);
  b.labels.resize(rows);
  for (auto& l : b.labels) l = static_cast<std::uint8_t>(rng() % 10);
  return b;
}
