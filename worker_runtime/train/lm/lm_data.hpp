// The text ddp-train's language model (--model llama) learns from: a real text shipped by a
// Debian package (the fortune databases of `fortunes` / `fortunes-min`,
// /usr/share/games/fortunes), read as bytes (vocabulary 256), split into training and
// validation text; the batches every step draws, and the unigram baseline the validation loss
// is judged against. The Python reference (tests/reference/llama_reference.py) draws the same
// batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::train {

struct TextCorpus {
  std::vector<std::uint8_t> train;  // the first (1 - val_fraction) of the bytes
  std::vector<std::uint8_t> val;    // the rest
  std::vector<std::string> files;   // what was read, in order
};

// `path`: a file, or a folder whose regular files with no '.' in their name (fortune's text
// files; its .dat indexes and .u8 links are skipped) are read in name order and concatenated.
// val_fraction in (0, 0.5]. Throws ConfigError naming the path when it is missing, holds no such
// file, or is too small (fewer than 2 (seq_len + 1) bytes on either side), and when the whole
// exceeds kMaxTextBytes.
TextCorpus load_corpus(const std::string& path, double val_fraction, std::size_t seq_len);
inline constexpr std::size_t kMaxTextBytes = std::size_t{1} << 30;
inline const char* const kDefaultTextPath = "/usr/share/games/fortunes";

// The first token of sequence g (0 <= g < global batch) of global step s, drawn from `seed`:
//   key = splitmix64((seed + 1) * 0xD1B54A32D192ED03 + s)   (uint64, wrapping)
//   start = splitmix64(key + g) % (train.size() - seq_len - 1)
// The sequence's inputs are train[start, start + seq_len), its targets one byte later. Data
// parallel rank d of D with b sequences each takes g in [d b, (d + 1) b): the global batch is the
// same at every mesh.
std::size_t sequence_start(std::uint64_t seed, std::int64_t step, std::size_t g,
                           std::size_t train_size, std::size_t seq_len);

// Tokens and targets of sequences [g0, g0 + count) of step s: inputs and targets
// [count * seq_len] each.
void fill_batch(const std::vector<std::uint8_t>& train, std::uint64_t seed, std::int64_t step,
                std::size_t g0, std::size_t count, std::size_t seq_len, std::int32_t* inputs,
                std::int32_t* targets);

// The validation windows: window i is val[i seq_len, (i + 1) seq_len) predicting one byte later,
// for i < min(max_windows, (val.size() - 1) / seq_len).
std::size_t val_window_count(const std::vector<std::uint8_t>& val, std::size_t seq_len,
                             std::size_t max_windows);
void fill_val_window(const std::vector<std::uint8_t>& val, std::size_t i, std::size_t seq_len,
                     std::int32_t* inputs, std::int32_t* targets);

// The cross-entropy (nats per byte) of the validation windows' targets under the training
// text's byte frequencies with add-one smoothing: what a model that ignores context reaches.
double unigram_baseline(const TextCorpus& c, std::size_t seq_len, std::size_t max_windows);

}  // namespace ddp::train
