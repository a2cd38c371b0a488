// Training data for ddp-train: IDX files (Fashion-MNIST, gzipped or not), and the tutorials'
// synthetic MyTrainDataset. parse_idx is pure; the loaders name the file and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::train {

struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;  // unsigned bytes (type 0x08), row-major
};

// Throws ddp::ConfigError "<name>: ..." for a bad magic, a type other than unsigned byte, or a
// size that does not match the dimensions.
IdxArray parse_idx(std::string_view bytes, const std::string& name);
// Reads the file (gzip-compressed or plain) and parses it. limit > 0 reads only the first
// `limit` items (dims[0] is then at most limit), so a subset does not decompress the rest; the
// file's length is then checked only that far.
IdxArray read_idx_file(const std::string& path, std::size_t limit = 0);

struct Dataset {
  std::size_t n = 0;                 // samples
  std::size_t dim = 0;               // inputs per sample
  std::size_t classes = 0;           // > 0: labels are class indices
  std::size_t out_dim = 0;           // regression targets per sample (classes == 0)
  std::vector<float> x;              // [n][dim]
  std::vector<std::uint8_t> labels;  // [n] when classes > 0
  std::vector<float> y;              // [n][out_dim] when regression
};

// Fashion-MNIST's train or test split from `dir`: "<split>-images-idx3-ubyte[.gz]" and
// "<split>-labels-idx1-ubyte[.gz]", split being "train" or "t10k"; pixels scaled to [0, 1].
// `limit` > 0 keeps only the first `limit` samples.
Dataset load_fashion_mnist(const std::string& dir, bool train, std::size_t limit);
// MyTrainDataset(n): 20 inputs and 1 target uniform in [0, 1), seeded by 12345 + n.
Dataset make_synthetic(std::size_t n);

// SplitMix64: the trainer's only random source (init, shuffles, synthetic data).
struct SplitMix64 {
  std::uint64_t state;
  explicit SplitMix64(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0,1)
};

}  // namespace ddp::train
