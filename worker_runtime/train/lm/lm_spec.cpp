// The LLaMA-style decoder's tensors, tensor-parallel cuts and initial values (lm_spec.hpp).
#include "lm_spec.hpp"

#include <algorithm>
#include <cmath>

#include "ddp/proto/error.hpp"

namespace ddp::train {
namespace {

void check_size(const char* flag, std::size_t v, std::size_t max) {
  if (v == 0 || v > max) {
    throw ConfigError(std::string(flag) + " " + std::to_string(v) + ": expected 1 to " +
                      std::to_string(max));
  }
}

void check_split(const char* what, std::size_t n, int tp) {
  if (n % static_cast<std::size_t>(tp) != 0) {
    throw ConfigError(std::string(what) + " " + std::to_string(n) + " does not split over tp=" +
                      std::to_string(tp) + " (tensor parallelism needs a multiple of tp)");
  }
}

}  // namespace

std::size_t LmConfig::ffn() const {
  if (ffn_hidden != 0) return ffn_hidden;
  const std::size_t multiple_of = 256;
  const std::size_t h = 2 * (4 * dim) / 3;
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

void validate(const LmConfig& c, int tp) {
  check_size("--dim", c.dim, kMaxLmDim);
  check_size("--n-layers", c.n_layers, kMaxLmLayers);
  check_size("--n-heads", c.n_heads, kMaxLmHeads);
  check_size("--seq-len", c.seq_len, kMaxLmSeq);
  check_size("--ffn-hidden", c.ffn(), kMaxLmFfn);
  if (c.vocab == 0 || c.vocab > 65536) throw ConfigError("vocabulary size out of range");
  if (c.dim % c.n_heads != 0) {
    throw ConfigError("--dim " + std::to_string(c.dim) + " is not a multiple of --n-heads " +
                      std::to_string(c.n_heads));
  }
  if (c.head_dim() % 2 != 0) {
    throw ConfigError("--dim / --n-heads = " + std::to_string(c.head_dim()) +
                      ": the head size must be even (rotary embeddings rotate pairs)");
  }
  if (!(c.norm_eps > 0.0f) || !(c.rope_theta > 1.0f)) {
    throw ConfigError("norm eps must be positive and rope theta above 1");
  }
  if (tp < 1) throw ConfigError("tp=" + std::to_string(tp) + " is not positive");
  check_split("--n-heads", c.n_heads, tp);
  check_split("--ffn-hidden", c.ffn(), tp);
  if (!c.tied) check_split("the vocabulary", c.vocab, tp);
}

std::vector<LmTensor> lm_tensors(const LmConfig& c) {
  const std::size_t d = c.dim;
  const std::size_t hd = c.n_heads * c.head_dim();
  const std::size_t f = c.ffn();
  const std::size_t root = c.n_layers + 1;
  std::vector<LmTensor> t;
  auto add = [&t](std::string name, std::size_t rows, std::size_t cols, TpSplit split,
                  std::size_t unit, float std, bool transposed = false) {
    LmTensor x;
    x.name = std::move(name);
    x.rows = rows;
    x.cols = cols;
    x.split = split;
    x.unit = unit;
    x.std = std;
    x.transposed = transposed;
    t.push_back(std::move(x));
  };
  auto norm = [&t, d](std::string name, std::size_t unit) {
    LmTensor x;
    x.name = std::move(name);
    x.rows = 1;
    x.cols = d;
    x.unit = unit;
    x.ones = true;
    t.push_back(std::move(x));
  };
  add("tok_embeddings.weight", c.vocab, d, TpSplit::replicated, c.tied ? root : 0, 1.0f);
  t.back().clip = false;
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::size_t u = l + 1;
    const auto depth_std = static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(l + 1)));
    norm(p + "attention_norm.weight", u);
    add(p + "attention.wq.weight", hd, d, TpSplit::rows, u, 0.02f);
    add(p + "attention.wk.weight", hd, d, TpSplit::rows, u, 0.02f);
    add(p + "attention.wv.weight", hd, d, TpSplit::rows, u, 0.02f);
    add(p + "attention.wo.weight", hd, d, TpSplit::rows, u, depth_std, true);
    norm(p + "ffn_norm.weight", u);
    add(p + "feed_forward.w1.weight", f, d, TpSplit::rows, u, 0.02f);
    add(p + "feed_forward.w3.weight", f, d, TpSplit::rows, u, depth_std);
    add(p + "feed_forward.w2.weight", f, d, TpSplit::rows, u, depth_std, true);
  }
  norm("norm.weight", root);
  if (!c.tied) {
    add("output.weight", c.vocab, d, TpSplit::rows, root,
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))));
  }
  return t;
}

std::size_t lm_param_count(const LmConfig& c) {
  std::size_t n = 0;
  for (const LmTensor& t : lm_tensors(c)) n += t.size();
  return n;
}

std::size_t lm_unit_count(const LmConfig& c) { return c.n_layers + 2; }

TpLayout make_tp_layout(const LmConfig& c, int tp, int rank) {
  validate(c, tp);
  if (rank < 0 || rank >= tp) {
    throw ConfigError("tensor-parallel rank " + std::to_string(rank) +
                      " outside tp=" + std::to_string(tp));
  }
  TpLayout l;
  l.tp = tp;
  l.rank = rank;
  l.tensors = lm_tensors(c);
  const std::size_t n = l.tensors.size();
  l.lo.assign(n, 0);
  l.hi.assign(n, 0);
  l.local.assign(n, 0);
  const auto t = static_cast<std::size_t>(tp);
  const auto r = static_cast<std::size_t>(rank);
  for (std::size_t j = 0; j < n; ++j) {
    const LmTensor& x = l.tensors[j];
    if (x.split == TpSplit::rows) {
      const std::size_t rows = x.rows / t;
      l.lo[j] = r * rows * x.cols;
      l.hi[j] = (r + 1) * rows * x.cols;
    } else {
      l.hi[j] = x.size();
    }
  }
  const std::size_t units = lm_unit_count(c);
  l.unit_begin.assign(units, 0);
  l.unit_end.assign(units, 0);
  std::size_t off = 0;
  for (std::size_t u = 0; u < units; ++u) {
    l.unit_begin[u] = off;
    for (std::size_t j = 0; j < n; ++j) {
      if (l.tensors[j].unit != u) continue;
      l.local[j] = off;
      off += l.part(j);
    }
    l.unit_end[u] = off;
  }
  l.local_size = off;
  return l;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void lm_init_slice(const LmConfig& c, std::uint64_t seed, std::size_t j, std::size_t lo,
                   std::size_t hi, float* out) {
  const std::vector<LmTensor> tensors = lm_tensors(c);
  if (j >= tensors.size() || lo > hi || hi > tensors[j].size()) {
    throw ConfigError("lm_init_slice: no [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      ") in tensor " + std::to_string(j));
  }
  const LmTensor& t = tensors[j];
  if (t.ones) {
    std::fill(out, out + (hi - lo), 1.0f);
    return;
  }
  const std::uint64_t base = splitmix64(seed ^ (0x5851F42D4C957F2DULL * (j + 1)));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kInv53 = 1.0 / 9007199254740992.0;  // 2^-53
  for (std::size_t i = lo; i < hi; ++i) {
    const std::uint64_t h1 = splitmix64(base + 2 * i);
    const std::uint64_t h2 = splitmix64(base + 2 * i + 1);
    const double u1 = (static_cast<double>(h1 >> 11) + 0.5) * kInv53;
    const double u2 = static_cast<double>(h2 >> 11) * kInv53;
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    if (t.clip) z = std::clamp(z, -3.0, 3.0);
    out[i - lo] = static_cast<float>(static_cast<double>(t.std) * z);
  }
}

}  // namespace ddp::train
