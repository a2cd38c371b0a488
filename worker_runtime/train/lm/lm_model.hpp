// One tensor-parallel rank of ddp-train's LLaMA-style decoder (lm_spec.hpp): forward, loss and
// backward of a batch of sequences with Megatron's column- and row-parallel layers. wq, wk, wv,
// w1, w3 and the output layer hold this rank's rows (its heads, hidden units, vocabulary); wo and
// w2 the matching inputs. Their partial products are summed over the tp group: after wo and w2
// in forward, at the inputs of the column-parallel layers in backward; the output's logits are
// all-gathered so every tp rank computes the whole loss. Norms and the embedding are replicated:
// their inputs and gradients are the same on every tp rank, so they need no collective.
// Where a unit's parameters are read from and its gradients go is the engine's (UnitMemory), so
// a data-parallel engine can gather and shard them (lm_engine.cpp). Matrix products go through
// BLAS; the rest are the CPU references of ddp/kernels/lm_ref.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lm_spec.hpp"

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

// Unit u's parameters: this rank's local part of the unit (TpLayout: unit_begin[u] to
// unit_end[u]), tensor j at local[j] - unit_begin[u]; gradients in the same layout.
// Order of calls in a training step: forward acquires (Pass::forward) and releases units 0, 1,
// ..., n_layers; the root (n_layers + 1) is acquired when first needed (at the end of forward, or
// at the start when the embedding is tied) and released once, with Pass::backward, when its
// gradients are complete (in evaluation: with Pass::forward at the end of forward). Backward,
// from the root down to unit 0, acquires each block (Pass::backward), adds to grads(u), releases
// it and calls done(u) once u's gradients are complete. Unit 0 (the untied embedding) is never
// acquired in backward (its gradient needs no parameters); when tied it is empty and done(0)
// comes last.
class UnitMemory {
 public:
  enum class Pass { forward, backward };
  virtual ~UnitMemory() = default;
  virtual const float* acquire(std::size_t u, Pass pass) = 0;
  virtual void release(std::size_t u, Pass pass) = 0;
  virtual float* grads(std::size_t u) = 0;
  virtual void done(std::size_t u) = 0;
};

class LmModel {
 public:
  // tp: the tensor-parallel group (null for tp = 1); layout.tp must be its size.
  LmModel(const LmConfig& c, TpLayout layout, worker::Communicator* tp);
  ~LmModel();
  LmModel(const LmModel&) = delete;
  LmModel& operator=(const LmModel&) = delete;

  const LmConfig& config() const { return c_; }
  const TpLayout& layout() const { return layout_; }
  worker::Communicator* tp() const { return tp_; }

  // Forward, loss and backward of `batch` sequences of seq_len tokens: the loss's gradient is
  // scaled by `scale` (1 / the global batch's tokens, so data-parallel sums give the mean).
  // Returns this rank's summed loss (the tp group's ranks return the same).
  double train_batch(UnitMemory& mem, const std::int32_t* tokens, const std::int32_t* targets,
                     std::size_t batch, float scale);
  // The summed loss of `batch` sequences, forward only (collective over tp, and over dp when the
  // memory gathers).
  double eval_batch(UnitMemory& mem, const std::int32_t* tokens, const std::int32_t* targets,
                    std::size_t batch);

 private:
  struct Block;  // one block's saved activations
  void reserve(std::size_t batch);
  const float* tensor(const float* unit_params, std::size_t j) const {
    return unit_params + (layout_.local[j] - layout_.unit_begin[layout_.tensors[j].unit]);
  }
  float* tensor(float* unit_params, std::size_t j) const {
    return unit_params + (layout_.local[j] - layout_.unit_begin[layout_.tensors[j].unit]);
  }
  double forward(UnitMemory& mem, const std::int32_t* tokens, const std::int32_t* targets,
                 std::size_t batch, float scale, bool training);
  void block_forward(std::size_t l, const float* p, std::size_t batch);
  void block_backward(std::size_t l, const float* p, float* g, std::size_t batch);
  void all_reduce(float* x, std::size_t n);
  std::size_t first(std::size_t l) const { return 1 + 9 * l; }  // block l's first tensor

  LmConfig c_;
  TpLayout layout_;
  worker::Communicator* tp_;
  std::size_t heads_ = 0;  // local heads
  std::size_t qdim_ = 0;   // local heads * head_dim
  std::size_t ffn_ = 0;    // local hidden units
  std::size_t vocab_ = 0;  // local vocabulary (all of it when tied)
  std::size_t root_ = 0;
  std::size_t emb_ = 0;  // tensor index of the embedding, the final norm, the output
  std::size_t norm_ = 0;
  std::size_t out_ = 0;  // == emb_ when tied
  std::size_t rows_cap_ = 0;
  std::vector<Block> blocks_;
  std::vector<float> h_;         // residual stream entering the final norm [rows][dim]
  std::vector<float> rstd_;      // final norm's
  std::vector<float> hn_;        // final norm's output
  std::vector<float> logits_;    // this rank's logits [rows][vocab_]
  std::vector<float> gathered_;  // all tp ranks' logits, then the whole [rows][vocab]
  std::vector<float> dlogits_;
  std::vector<float> dh_;  // gradient of the residual stream
  std::vector<float> dx_;  // scratch [rows][dim]
  std::vector<float> dq_, dk_, dv_, do_, dff_, dff2_;
  std::vector<float> dmid_;             // [rows][dim] scratch
  const float* root_params_ = nullptr;  // the root's, from forward to its backward
};

}  // namespace ddp::train
