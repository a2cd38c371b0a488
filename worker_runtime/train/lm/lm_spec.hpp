// ddp-train's LLaMA-style decoder (--model llama, issue 20), as data: its sizes, its tensors in
// one canonical order, how tensor parallelism cuts each tensor, and their initial values. Pure:
// no communication, no files. The Python reference (tests/reference/llama_reference.py) follows
// this file exactly: the same tensors, the same initial values, the same batches.
//
// The model (the seed's llama2_model.py, at our sizes): h = tok_embeddings[tokens]; per block
// h += wo(attention(rope(wq a), rope(wk a), wv a)) with a = attention_norm(h), then
// h += w2(silu(w1 b) * w3 b) with b = ffn_norm(h); logits = output(norm(h)). RMSNorm with a
// weight and no bias, no biases anywhere, causal attention, byte-level vocabulary.
//
// Canonical storage: every tensor is a row-major matrix [rows][cols]. Linear weights are torch's
// [out][in], except the row-parallel ones (wo and w2), stored transposed ([in][out]) so that
// tensor parallelism always cuts rows: rank t of T holds rows [t rows/T, (t+1) rows/T) of a
// split tensor (wq, wk, wv, w1, w3 by output = heads or hidden units; woT, w2T by input; output
// by vocabulary), and the whole of a replicated one (embedding, norms; the output too when tied
// to the embedding). A rank's part of any tensor is then one contiguous range of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::train {

struct LmConfig {
  std::size_t vocab = 256;  // bytes
  std::size_t dim = 256;    // the seed's simple_llama2_config: dim 256, 2 layers, 16 heads
  std::size_t n_layers = 2;
  std::size_t n_heads = 16;
  std::size_t ffn_hidden = 0;  // 0: LLaMA's rule, below
  std::size_t seq_len = 128;
  bool tied = false;  // output layer tied to the embedding
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;

  std::size_t head_dim() const { return dim / n_heads; }
  // ffn_hidden, or LLaMA's rule: h = 2 * (4 dim) / 3 (integer division), rounded up to a
  // multiple of 256 (ModelArgs.multiple_of).
  std::size_t ffn() const;
};

// Bounds on the sizes a user gives (ConfigError past them).
inline constexpr std::size_t kMaxLmDim = 8192;
inline constexpr std::size_t kMaxLmLayers = 128;
inline constexpr std::size_t kMaxLmHeads = 256;
inline constexpr std::size_t kMaxLmSeq = 8192;
inline constexpr std::size_t kMaxLmFfn = 65536;

// Throws ConfigError naming the flag: a size of 0 or past its bound, dim not a multiple of
// n_heads, an odd head_dim, or (tp > 1) heads, ffn() or vocab not divisible by tp.
void validate(const LmConfig& c, int tp);

enum class TpSplit { replicated, rows };

// The units that full sharding gathers one at a time (FSDP2's fully_shard per block): unit 0
// the embedding, unit 1 + l block l, unit n_layers + 1 the root (final norm and output; the
// embedding too when tied, since the output reads it).
struct LmTensor {
  std::string name;  // torch's name: "tok_embeddings.weight", "layers.0.attention.wq.weight",
                     // ... ("layers.L.attention.wo.weight" and "...feed_forward.w2.weight" are
                     // stored transposed, see above)
  std::size_t rows = 0;
  std::size_t cols = 0;
  TpSplit split = TpSplit::replicated;
  std::size_t unit = 0;
  bool transposed = false;  // canonical = torch's weight transposed (wo, w2)
  // Initial values: ones (norms), or std * z with z a normal draw (clipped to [-3, 3] when
  // clip). Embedding: std 1, no clip; wq, wk, wv, w1: 0.02; wo, w2, w3 of block l:
  // 0.02 / sqrt(2 (l + 1)) (the seed's depth_init); output: dim^-0.5.
  bool ones = false;
  float std = 0.0f;
  bool clip = true;
  std::size_t size() const { return rows * cols; }
};

// In canonical order: tok_embeddings; per block attention_norm, wq, wk, wv, woT, ffn_norm, w1,
// w3, w2T; norm; output (absent when tied).
std::vector<LmTensor> lm_tensors(const LmConfig& c);
std::size_t lm_param_count(const LmConfig& c);
std::size_t lm_unit_count(const LmConfig& c);  // n_layers + 2

// One tensor-parallel rank's parameters: its part of every tensor, grouped by unit (units in
// order, tensors in canonical order within a unit) in one local vector, so each unit's part is
// contiguous.
struct TpLayout {
  int tp = 1;
  int rank = 0;
  std::vector<LmTensor> tensors;  // lm_tensors(c)
  std::vector<std::size_t> lo;    // tensor j: canonical elements [lo[j], hi[j]) held here
  std::vector<std::size_t> hi;
  std::vector<std::size_t> local;       // where tensor j's part starts in the local vector
  std::vector<std::size_t> unit_begin;  // unit u: [unit_begin[u], unit_end[u]) of the local
  std::vector<std::size_t> unit_end;    //   vector
  std::size_t local_size = 0;
  std::size_t part(std::size_t j) const { return hi[j] - lo[j]; }
};
// Throws ConfigError when the config does not split tp ways (validate) or rank is outside.
TpLayout make_tp_layout(const LmConfig& c, int tp, int rank);

// The counter-based draws everything random in the model uses: splitmix64 (Steele et al.), the
// same in Python with numpy's uint64 (wrapping) arithmetic.
std::uint64_t splitmix64(std::uint64_t x);

// Elements [lo, hi) of canonical tensor j's initial values for `seed`: element i of tensor j is
//   base = splitmix64(seed ^ (0x5851F42D4C957F2D * (j + 1)))
//   h1 = splitmix64(base + 2 i), h2 = splitmix64(base + 2 i + 1)
//   u1 = ((h1 >> 11) + 0.5) / 2^53, u2 = (h2 >> 11) / 2^53
//   z = sqrt(-2 ln u1) cos(2 pi u2) (double), clipped to [-3, 3] when the tensor clips
//   value = float(std * z), or 1 for a norm
// so any slice (a rank's part or shard) is drawn without drawing the rest.
void lm_init_slice(const LmConfig& c, std::uint64_t seed, std::size_t j, std::size_t lo,
                   std::size_t hi, float* out);

}  // namespace ddp::train
