// The language model's text and batches (lm_data.hpp): the fortunes folder and small temporary
// texts load in name order with the documented split, bad paths and small texts are ConfigErrors
// naming them, sequence starts follow the formula (pinned values shared with
// tests/reference/llama_spec.py) and are the same global batch at every data-parallel width, and
// the validation windows and unigram baseline are what a hand computation gives.
#include "lm_data.hpp"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "support/temp_dir.hpp"
#include "lm_spec.hpp"

namespace fs = std::filesystem;
using namespace ddp::train;
using ddp::test::TempDir;

namespace {

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// n bytes cycling through the lowercase letters, starting at `first`.
std::string letters(std::size_t n, char first = 'a') {
  std::string s(n, ' ');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (first - 'a' + i) % 26);
  return s;
}

std::vector<std::string> fortune_texts() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kDefaultTextPath)) {
    const std::string n = e.path().filename().string();
    if (n.find('.') == std::string::npos && e.is_regular_file()) names.push_back(n);
  }
  return names;
}

}  // namespace

TEST_CASE("lm_data: the fortunes folder loads its text files in name order, 90/10",
          "[unit][train][lm_data]") {
  REQUIRE(fs::is_directory(kDefaultTextPath));  // scripts/setup.sh installs fortunes
  const TextCorpus c = load_corpus(kDefaultTextPath, 0.1, 128);
  const std::vector<std::string> names = fortune_texts();
  const std::set<std::string> expected(names.begin(), names.end());
  REQUIRE(c.files.size() == expected.size());
  REQUIRE(c.files.size() >= 1);
  std::uintmax_t total = 0;
  for (std::size_t i = 0; i < c.files.size(); ++i) {
    const std::string name = fs::path(c.files[i]).filename().string();
    CHECK(expected.count(name) == 1);
    CHECK(name.find('.') == std::string::npos);
    if (i > 0) CHECK(fs::path(c.files[i - 1]).filename().string() < name);
    total += fs::file_size(c.files[i]);
  }
  REQUIRE(c.train.size() + c.val.size() == total);
  CHECK(c.val.size() == static_cast<std::size_t>(static_cast<double>(total) * 0.1));
  // The first bytes are the first file's.
  std::ifstream first(c.files.front(), std::ios::binary);
  std::array<char, 64> head{};
  first.read(head.data(), head.size());
  REQUIRE(first.gcount() == static_cast<std::streamsize>(head.size()));
  for (std::size_t i = 0; i < head.size(); ++i)
    CHECK(c.train[i] == static_cast<std::uint8_t>(head[i]));
}

TEST_CASE("lm_data: a file path is read whole, whatever its name", "[unit][train][lm_data]") {
  TempDir dir("ddp_lm_data");
  const std::string text = letters(100);
  const std::string file = dir.write("some.text.txt", text);
  const TextCorpus c = load_corpus(file, 0.2, 8);
  REQUIRE(c.files == std::vector<std::string>{file});
  CHECK(c.train == bytes_of(text.substr(0, 80)));
  CHECK(c.val == bytes_of(text.substr(80)));
}

TEST_CASE("lm_data: a folder's text files are read in name order, .dat, .u8 and folders skipped",
          "[unit][train][lm_data]") {
  TempDir dir("ddp_lm_data");
  dir.write("b", letters(30, 'b'));
  dir.write("a", letters(30, 'a'));
  dir.write("C", letters(30, 'c'));  // 'C' sorts before 'a'
  dir.write("a.dat", "index bytes");
  dir.write("b.u8", "link bytes");
  dir.write(".hidden", "hidden bytes");
  fs::create_directory(dir.path + "/sub");
  dir.write("sub/x", letters(30, 'x'));
  const TextCorpus c = load_corpus(dir.path, 0.5, 4);
  REQUIRE(c.files.size() == 3);
  CHECK(fs::path(c.files[0]).filename() == "C");
  CHECK(fs::path(c.files[1]).filename() == "a");
  CHECK(fs::path(c.files[2]).filename() == "b");
  const std::string all = letters(30, 'c') + letters(30, 'a') + letters(30, 'b');
  CHECK(c.train == bytes_of(all.substr(0, 45)));
  CHECK(c.val == bytes_of(all.substr(45)));
}

TEST_CASE("lm_data: load_corpus errors name the path and what is wrong", "[unit][train][lm_data]") {
  TempDir dir("ddp_lm_data");
  const std::string missing = dir.path + "/nope";
  CHECK_THROWS_AS(load_corpus(missing, 0.1, 8), ddp::ConfigError);
  CHECK_THROWS_WITH(load_corpus(missing, 0.1, 8),
                    Catch::Contains(missing) && Catch::Contains("no such file or folder"));
  fs::create_directory(dir.path + "/empty");
  CHECK_THROWS_WITH(load_corpus(dir.path + "/empty", 0.1, 8),
                    Catch::Contains(dir.path + "/empty") && Catch::Contains("no text file"));
  fs::create_directory(dir.path + "/indexes");
  dir.write("indexes/art.dat", letters(500));
  dir.write("indexes/art.u8", letters(500));
  CHECK_THROWS_WITH(load_corpus(dir.path + "/indexes", 0.1, 8), Catch::Contains("no text file"));
  // 2 (seq_len + 1) = 18 bytes needed on each side: 40 bytes at 0.5 suffice, 35 do not.
  const std::string ok = dir.write("ok", letters(40));
  CHECK_NOTHROW(load_corpus(ok, 0.5, 8));
  const std::string small = dir.write("small", letters(35));
  CHECK_THROWS_AS(load_corpus(small, 0.5, 8), ddp::ConfigError);
  CHECK_THROWS_WITH(load_corpus(small, 0.5, 8),
                    Catch::Contains(small) && Catch::Contains("too small"));
  CHECK_THROWS_WITH(load_corpus(ok, 0.1, 8), Catch::Contains("too small"));  // 4 val bytes
  CHECK_THROWS_WITH(load_corpus(ok, 0.0, 8), Catch::Contains("--val-fraction"));
  CHECK_THROWS_WITH(load_corpus(ok, 0.6, 8), Catch::Contains("--val-fraction"));
  CHECK_THROWS_AS(load_corpus(ok, std::nan(""), 8), ddp::ConfigError);
}

TEST_CASE("lm_data: the split keeps floor(n * val_fraction) bytes for validation",
          "[unit][train][lm_data]") {
  TempDir dir("ddp_lm_data");
  struct Case {
    std::size_t n;
    double fraction;
    std::size_t val;
  };
  for (const Case k :
       {Case{1000, 0.1, 100}, Case{999, 0.25, 249}, Case{1001, 0.5, 500}, Case{777, 0.3, 233}}) {
    const std::string text = letters(k.n);
    const TextCorpus c = load_corpus(dir.write("t", text), k.fraction, 16);
    CHECK(c.val.size() == k.val);
    CHECK(c.train.size() == k.n - k.val);
    CHECK(c.train == bytes_of(text.substr(0, k.n - k.val)));
  }
}

TEST_CASE("lm_data: sequence_start follows its formula, stays in range, is deterministic",
          "[unit][train][lm_data]") {
  // splitmix64's first output from 0, and values tests/reference/llama_spec.py gives too.
  CHECK(splitmix64(0) == 0xE220A8397B1DCDAFull);
  CHECK(sequence_start(0, 0, 0, 1000, 16) == 98);
  CHECK(sequence_start(7, 3, 5, 1000, 16) == 470);
  CHECK(sequence_start(123456789, 100, 63, 2318992, 128) == 32944);
  CHECK(sequence_start(~std::uint64_t{0}, 0, 1, 50, 8) == 31);  // seed + 1 wraps to 0
  for (std::uint64_t seed : {0ull, 1ull, 42ull}) {
    for (std::int64_t step : {0, 1, 1000}) {
      const std::uint64_t key =
          splitmix64((seed + 1) * 0xD1B54A32D192ED03ull + static_cast<std::uint64_t>(step));
      for (std::size_t g = 0; g < 8; ++g) {
        CHECK(sequence_start(seed, step, g, 5000, 64) == splitmix64(key + g) % (5000 - 64 - 1));
      }
    }
  }
  std::set<std::size_t> seen;
  for (std::size_t g = 0; g < 2000; ++g) {
    const std::size_t s = sequence_start(3, 9, g, 100, 10);
    REQUIRE(s + 10 + 1 < 100);  // start < train_size - seq_len - 1
    seen.insert(s);
    CHECK(sequence_start(3, 9, g, 100, 10) == s);
  }
  CHECK(seen.size() == 89);  // every start is drawn
  CHECK(sequence_start(3, 9, 0, 1 << 20, 10) != sequence_start(3, 10, 0, 1 << 20, 10));
  CHECK(sequence_start(3, 9, 0, 1 << 20, 10) != sequence_start(4, 9, 0, 1 << 20, 10));
  CHECK_THROWS_AS(sequence_start(0, 0, 0, 11, 10), ddp::ConfigError);
}

TEST_CASE("lm_data: fill_batch targets are the inputs shifted by one byte",
          "[unit][train][lm_data]") {
  std::vector<std::uint8_t> train(300);
  for (std::size_t i = 0; i < train.size(); ++i) train[i] = static_cast<std::uint8_t>(i * 7 + 3);
  const std::size_t seq = 12, count = 5;
  std::vector<std::int32_t> in(count * seq), tg(count * seq);
  fill_batch(train, 11, 4, 2, count, seq, in.data(), tg.data());
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t start = sequence_start(11, 4, 2 + k, train.size(), seq);
    for (std::size_t t = 0; t < seq; ++t) {
      CHECK(in[k * seq + t] == train[start + t]);
      CHECK(tg[k * seq + t] == train[start + t + 1]);
      if (t + 1 < seq) CHECK(tg[k * seq + t] == in[k * seq + t + 1]);
    }
  }
}

TEST_CASE("lm_data: data-parallel ranks' slices concatenate to the global batch",
          "[unit][train][lm_data]") {
  std::vector<std::uint8_t> train(4096);
  for (std::size_t i = 0; i < train.size(); ++i) {
    train[i] = static_cast<std::uint8_t>(splitmix64(i) & 0xFF);
  }
  const std::size_t seq = 16, global = 12;
  std::vector<std::int32_t> whole_in(global * seq), whole_tg(global * seq);
  fill_batch(train, 5, 7, 0, global, seq, whole_in.data(), whole_tg.data());
  for (std::size_t dp : {2u, 3u, 4u, 6u, 12u}) {
    const std::size_t b = global / dp;
    std::vector<std::int32_t> cat_in, cat_tg;
    for (std::size_t d = 0; d < dp; ++d) {
      std::vector<std::int32_t> in(b * seq), tg(b * seq);
      fill_batch(train, 5, 7, d * b, b, seq, in.data(), tg.data());
      cat_in.insert(cat_in.end(), in.begin(), in.end());
      cat_tg.insert(cat_tg.end(), tg.begin(), tg.end());
    }
    CHECK(cat_in == whole_in);
    CHECK(cat_tg == whole_tg);
  }
}

TEST_CASE("lm_data: validation windows tile the validation text", "[unit][train][lm_data]") {
  const std::vector<std::uint8_t> val = bytes_of("0123456789abcdefghij");  // 20 bytes
  CHECK(val_window_count(val, 4, 100) == 4);                               // (20 - 1) / 4
  CHECK(val_window_count(val, 4, 3) == 3);
  CHECK(val_window_count(val, 5, 100) == 3);  // the last window needs one byte past it
  CHECK(val_window_count(val, 19, 100) == 1);
  CHECK(val_window_count(val, 20, 100) == 0);
  CHECK(val_window_count({}, 4, 100) == 0);
  std::array<std::int32_t, 4> in{}, tg{};
  fill_val_window(val, 2, 4, in.data(), tg.data());
  CHECK(in == std::array<std::int32_t, 4>{'8', '9', 'a', 'b'});
  CHECK(tg == std::array<std::int32_t, 4>{'9', 'a', 'b', 'c'});
  fill_val_window(val, 3, 4, in.data(), tg.data());
  CHECK(in == std::array<std::int32_t, 4>{'c', 'd', 'e', 'f'});
  CHECK(tg == std::array<std::int32_t, 4>{'d', 'e', 'f', 'g'});
  CHECK_THROWS_AS(fill_val_window(val, 4, 4, in.data(), tg.data()), ddp::ConfigError);
}

TEST_CASE("lm_data: the unigram baseline is add-one-smoothed training frequencies",
          "[unit][train][lm_data]") {
  TextCorpus c;
  c.train = bytes_of("aaab");  // counts a 3, b 1; denominator 4 + 256
  c.val = bytes_of("abacx");   // windows of 2: "ab"->"ba", cut at (5 - 1) / 2 = 2
  const double pa = 4.0 / 260, pb = 2.0 / 260, pc = 1.0 / 260;
  // Window 0 predicts 'b', 'a'; window 1 predicts 'c', 'x'.
  const double all = -(std::log(pb) + std::log(pa) + std::log(pc) + std::log(pc)) / 4;
  CHECK(unigram_baseline(c, 2, 100) == Approx(all).epsilon(1e-12));
  const double first = -(std::log(pb) + std::log(pa)) / 2;
  CHECK(unigram_baseline(c, 2, 1) == Approx(first).epsilon(1e-12));
  CHECK_THROWS_AS(unigram_baseline(c, 2, 0), ddp::ConfigError);
}

TEST_CASE("lm_data: the fortunes' unigram baseline is near their byte entropy",
          "[unit][train][lm_data]") {
  REQUIRE(fs::is_directory(kDefaultTextPath));
  const std::size_t seq = 128, windows = 64;
  const TextCorpus c = load_corpus(kDefaultTextPath, 0.1, seq);
  const double baseline = unigram_baseline(c, seq, windows);
  // The empirical entropy of the same targets: the baseline (a cross-entropy) is above it.
  std::array<double, 256> count{};
  const std::size_t n = val_window_count(c.val, seq, windows);
  REQUIRE(n == windows);
  for (std::size_t i = 0; i < n * seq; ++i) count[c.val[i + 1]] += 1.0;
  double entropy = 0.0;
  for (const double k : count) {
    if (k > 0)
      entropy -= k / static_cast<double>(n * seq) * std::log(k / static_cast<double>(n * seq));
  }
  INFO("baseline " << baseline << " nats, target entropy " << entropy << " nats");
  CHECK(baseline > entropy);
  CHECK(baseline < entropy + 0.3);
  CHECK(baseline > 3.0);  // about 3.46 nats (4.99 bits) per byte for English text
  CHECK(baseline < 4.0);
  // Over every window it is about 3.38.
  const double everything = unigram_baseline(c, seq, std::size_t{1} << 40);
  CHECK(everything > 3.0);
  CHECK(everything < 4.0);
}
