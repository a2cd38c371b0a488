// The language model's text and batches (see lm_data.hpp): the corpus read as bytes and split,
// the counter-based sequence starts every mesh shares, the validation windows and the unigram
// baseline. The split keeps floor(n * val_fraction) bytes (the product in double) for
// validation and the rest, the first bytes, for training; the Python reference computes the same.
#include "lm_data.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "ddp/proto/error.hpp"
#include "lm_spec.hpp"

namespace ddp::train {

namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kStepMix = 0xD1B54A32D192ED03ull;

// The files `path` names: itself, or a folder's regular files without '.' in name order.
std::vector<std::string> list_text_files(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    throw ConfigError("--text " + path +
                      ": no such file or folder (install Debian's fortunes or fortunes-min, or "
                      "point --text at a text file or a folder of them)");
  }
  if (fs::is_regular_file(st)) return {path};
  if (!fs::is_directory(st)) throw ConfigError("--text " + path + ": not a file or a folder");
  std::vector<std::string> names;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find('.') != std::string::npos) continue;  // .dat indexes, .u8 links, hidden files
    std::error_code ec2;
    if (!it->is_regular_file(ec2) || ec2) continue;
    names.push_back(name);
  }
  if (ec) throw ConfigError("--text " + path + ": cannot list the folder (" + ec.message() + ")");
  if (names.empty()) {
    throw ConfigError("--text " + path +
                      ": the folder holds no text file (a regular file with no '.' in its name)");
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> files;
  files.reserve(names.size());
  for (const std::string& n : names) files.push_back((fs::path(path) / n).string());
  return files;
}

void append_file(const std::string& file, std::vector<std::uint8_t>& out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError("--text " + file + ": cannot open (" + std::strerror(errno) + ")");
  std::array<char, 1 << 16> buf{};
  for (;;) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(buf.data());
      out.insert(out.end(), p, p + got);
    }
    if (out.size() > kMaxTextBytes) {
      throw ConfigError("--text " + file + ": the text exceeds " + std::to_string(kMaxTextBytes) +
                        " bytes");
    }
    if (!in) break;
  }
  if (in.bad()) throw ConfigError("--text " + file + ": read error");
}

}  // namespace

TextCorpus load_corpus(const std::string& path, double val_fraction, std::size_t seq_len) {
  if (!(val_fraction > 0.0 && val_fraction <= 0.5)) {
    throw ConfigError("--val-fraction " + std::to_string(val_fraction) + ": must be in (0, 0.5]");
  }
  if (seq_len == 0) throw ConfigError("--seq-len: must be positive");
  TextCorpus c;
  c.files = list_text_files(path);
  std::uintmax_t total = 0;
  for (const std::string& f : c.files) {
    std::error_code ec;
    const std::uintmax_t n = fs::file_size(f, ec);
    if (ec) throw ConfigError("--text " + f + ": cannot stat (" + ec.message() + ")");
    total += n;
  }
  if (total > kMaxTextBytes) {
    throw ConfigError("--text " + path + ": " + std::to_string(total) + " bytes exceed the " +
                      std::to_string(kMaxTextBytes) + "-byte bound");
  }
  std::vector<std::uint8_t> all;
  all.reserve(static_cast<std::size_t>(total));
  for (const std::string& f : c.files) append_file(f, all);

  const std::size_t n = all.size();
  const auto n_val = static_cast<std::size_t>(static_cast<double>(n) * val_fraction);
  const std::size_t n_train = n - n_val;
  const std::size_t need = 2 * (seq_len + 1);
  if (n_train < need || n_val < need) {
    throw ConfigError(
        "--text " + path + ": too small: " + std::to_string(n) + " bytes give " +
        std::to_string(n_train) + " training and " + std::to_string(n_val) +
        " validation bytes, each side needs at least 2 (seq_len + 1) = " + std::to_string(need));
  }
  c.train.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_train));
  c.val.assign(all.begin() + static_cast<std::ptrdiff_t>(n_train), all.end());
  return c;
}

std::size_t sequence_start(std::uint64_t seed, std::int64_t step, std::size_t g,
                           std::size_t train_size, std::size_t seq_len) {
  if (train_size < seq_len + 2) {
    throw ConfigError("training text of " + std::to_string(train_size) +
                      " bytes is too short for sequences of " + std::to_string(seq_len));
  }
  const std::uint64_t key = splitmix64((seed + 1) * kStepMix + static_cast<std::uint64_t>(step));
  const std::uint64_t range = train_size - seq_len - 1;
  return static_cast<std::size_t>(splitmix64(key + g) % range);
}

void fill_batch(const std::vector<std::uint8_t>& train, std::uint64_t seed, std::int64_t step,
                std::size_t g0, std::size_t count, std::size_t seq_len, std::int32_t* inputs,
                std::int32_t* targets) {
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t start = sequence_start(seed, step, g0 + k, train.size(), seq_len);
    const std::uint8_t* src = train.data() + start;
    for (std::size_t t = 0; t < seq_len; ++t) {
      inputs[k * seq_len + t] = src[t];
      targets[k * seq_len + t] = src[t + 1];
    }
  }
}

std::size_t val_window_count(const std::vector<std::uint8_t>& val, std::size_t seq_len,
                             std::size_t max_windows) {
  if (seq_len == 0 || val.empty()) return 0;
  return std::min(max_windows, (val.size() - 1) / seq_len);
}

void fill_val_window(const std::vector<std::uint8_t>& val, std::size_t i, std::size_t seq_len,
                     std::int32_t* inputs, std::int32_t* targets) {
  if (seq_len == 0 || (i + 1) * seq_len + 1 > val.size()) {
    throw ConfigError("validation window " + std::to_string(i) + " of " + std::to_string(seq_len) +
                      " bytes is past the " + std::to_string(val.size()) + "-byte validation text");
  }
  const std::uint8_t* src = val.data() + i * seq_len;
  for (std::size_t t = 0; t < seq_len; ++t) {
    inputs[t] = src[t];
    targets[t] = src[t + 1];
  }
}

double unigram_baseline(const TextCorpus& c, std::size_t seq_len, std::size_t max_windows) {
  const std::size_t windows = val_window_count(c.val, seq_len, max_windows);
  if (windows == 0) throw ConfigError("unigram baseline: no validation window");
  std::array<std::uint64_t, 256> count{};
  for (const std::uint8_t b : c.train) ++count[b];
  const double denom = static_cast<double>(c.train.size()) + 256.0;
  std::array<double, 256> nll{};
  for (std::size_t b = 0; b < 256; ++b) {
    nll[b] = -std::log((static_cast<double>(count[b]) + 1.0) / denom);
  }
  double sum = 0.0;
  for (std::size_t i = 0; i < windows; ++i) {
    for (std::size_t t = 1; t <= seq_len; ++t) sum += nll[c.val[i * seq_len + t]];
  }
  return sum / static_cast<double>(windows * seq_len);
}

}  // namespace ddp::train
