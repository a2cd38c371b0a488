// The language model's spec without sockets or processes: the tensors and their sizes, the
// tensor-parallel cuts (every tp rank's parts tile each split tensor; units are contiguous),
// the counter-based initial values (any slice equals the whole's, the stds hold), the bounds,
// and the snapshot ranges every rank of a dp x tp mesh owns (they tile every tensor once).
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "ddp/proto/error.hpp"
#include "lm_engine.hpp"
#include "lm_checkpoint.hpp"
#include "lm_spec.hpp"
#include "shard_ranges.hpp"

using namespace ddp::train;

namespace {
LmConfig tiny() {
  LmConfig c;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.seq_len = 16;
  return c;
}
}  // namespace

TEST_CASE("lm tensors: the seed's layout and LLaMA's feed-forward rule", "[lm_spec]") {
  LmConfig c = tiny();
  CHECK(c.ffn() == 256);  // 2 * 128 / 3 = 85, up to 256
  c.dim = 256;
  CHECK(c.ffn() == 768);  // the seed's simple_llama2_config
  c = tiny();
  const auto t = lm_tensors(c);
  REQUIRE(t.size() == 1 + 9 * 2 + 2);
  CHECK(t[0].name == "tok_embeddings.weight");
  CHECK(t[4].name == "layers.0.attention.wv.weight");
  CHECK(t[5].transposed);  // wo stored [in][out]
  CHECK(t[9].transposed);  // w2
  CHECK(t.back().name == "output.weight");
  CHECK(lm_param_count(c) == 256 * 32 * 2 + 2 * (2 * 32 + 4 * 32 * 32 + 3 * 256 * 32) + 32);
  c.tied = true;
  CHECK(lm_tensors(c).size() == 20);
  CHECK(lm_tensors(c)[0].unit == 3);  // the tied embedding lives in the root
}

TEST_CASE("lm tp layout: parts tile the split tensors and units are contiguous", "[lm_spec]") {
  const LmConfig c = tiny();
  for (int tp : {1, 2, 4}) {
    std::size_t total = 0;
    for (int r = 0; r < tp; ++r) {
      const TpLayout l = make_tp_layout(c, tp, r);
      for (std::size_t j = 0; j < l.tensors.size(); ++j) {
        if (l.tensors[j].split == TpSplit::rows) {
          CHECK(l.part(j) * static_cast<std::size_t>(tp) == l.tensors[j].size());
          CHECK(l.lo[j] == static_cast<std::size_t>(r) * l.part(j));
        } else {
          CHECK(l.part(j) == l.tensors[j].size());
        }
        const std::size_t u = l.tensors[j].unit;
        CHECK(l.local[j] >= l.unit_begin[u]);
        CHECK(l.local[j] + l.part(j) <= l.unit_end[u]);
      }
      CHECK(l.unit_end.back() == l.local_size);
      total += l.local_size;
    }
    CHECK(total >= lm_param_count(c));
  }
  CHECK_THROWS_AS(make_tp_layout(c, 3, 0), ddp::ConfigError);  // 4 heads over 3
  CHECK_THROWS_AS(make_tp_layout(c, 2, 2), ddp::ConfigError);
}

TEST_CASE("lm init: a slice equals the whole's, with the seed's stds", "[lm_spec]") {
  const LmConfig c = tiny();
  const auto t = lm_tensors(c);
  for (std::size_t j : {std::size_t{0}, std::size_t{2}, std::size_t{5}, t.size() - 1}) {
    std::vector<float> whole(t[j].size()), part(100);
    lm_init_slice(c, 42, j, 0, whole.size(), whole.data());
    lm_init_slice(c, 42, j, 50, 150, part.data());
    CHECK(std::equal(part.begin(), part.end(), whole.begin() + 50));
    double s = 0, sq = 0;
    for (float v : whole) {
      s += v;
      sq += static_cast<double>(v) * v;
      if (t[j].clip) CHECK(std::abs(v) <= 3.0f * t[j].std * 1.0001f);
    }
    const double n = static_cast<double>(whole.size());
    const double sd = std::sqrt(sq / n - (s / n) * (s / n));
    CHECK(sd == Approx(t[j].std).epsilon(0.1));
  }
  std::vector<float> ones(32), other(100), first(100);
  lm_init_slice(c, 42, 1, 0, 32, ones.data());
  CHECK(ones == std::vector<float>(32, 1.0f));
  lm_init_slice(c, 42, 2, 0, 100, first.data());
  lm_init_slice(c, 43, 2, 0, 100, other.data());
  CHECK(first != other);
  CHECK_THROWS_AS(lm_init_slice(c, 1, 2, 0, t[2].size() + 1, first.data()), ddp::ConfigError);
  CHECK(splitmix64(0) == 0xE220A8397B1DCDAFULL);  // the published first output for seed 0
}

TEST_CASE("lm validate: bounds and divisibility are named", "[lm_spec]") {
  LmConfig c = tiny();
  c.n_heads = 5;
  CHECK_THROWS_WITH(validate(c, 1), Catch::Contains("--n-heads 5"));
  c = tiny();
  c.n_heads = 32;  // head size 1
  CHECK_THROWS_WITH(validate(c, 1), Catch::Contains("even"));
  c = tiny();
  c.seq_len = kMaxLmSeq + 1;
  CHECK_THROWS_WITH(validate(c, 1), Catch::Contains("--seq-len"));
  c = tiny();
  c.ffn_hidden = 100;
  CHECK_THROWS_WITH(validate(c, 8), Catch::Contains("--n-heads"));
  c.n_heads = 8;
  CHECK_THROWS_WITH(validate(c, 8), Catch::Contains("--ffn-hidden 100"));
  CHECK_NOTHROW(validate(tiny(), 4));
}

TEST_CASE("lm owned ranges tile every tensor once at every mesh and tying", "[lm_spec]") {
  for (bool tied : {false, true}) {
    LmConfig c = tiny();
    c.tied = tied;
    const auto slots = lm_slots(c);
    for (auto [dp, tp] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 2}, {1, 4}, {5, 1}}) {
      std::vector<FileRanges> all;
      for (int d = 0; d < dp; ++d) {
        for (int t = 0; t < tp; ++t) all.push_back(lm_owned_ranges(c, dp, tp, d, t));
      }
      CHECK_NOTHROW(check_tiling(slots, all));
      std::size_t n = 0;
      for (const auto& r : all) n += ranged_size(r);
      CHECK(n == lm_param_count(c));
    }
  }
  const auto j = lm_layout_json(tiny(), MeshShape{2, 2});
  CHECK(j.find("\"mesh\":\"dp=2,tp=2\"") != std::string::npos);
}
