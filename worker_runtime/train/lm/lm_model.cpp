// One tensor-parallel rank of the LLaMA-style decoder: forward, loss, backward (lm_model.hpp).
#include "lm_model.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "ddp/kernels/lm_ref.hpp"
#include "ddp/proto/error.hpp"
#include "lm_attention.hpp"
#include "lm_vec.hpp"
#include "ddp/worker/comm.hpp"

namespace ddp::train {

namespace cpu = kernels::cpu;

struct LmModel::Block {
  std::vector<float> x;        // the residual stream entering the block [rows][dim]
  std::vector<float> rstd1;    // attention_norm's
  std::vector<float> a1;       // attention_norm's output
  std::vector<float> q, k, v;  // [rows][qdim], q and k rotated
  std::vector<float> att;      // [batch][heads][seq][seq]
  std::vector<float> o;        // attention's output [rows][qdim]
  std::vector<float> mid;      // the stream after attention
  std::vector<float> rstd2;
  std::vector<float> a2;       // ffn_norm's output
  std::vector<float> g, u, s;  // [rows][ffn]: w1 a2, w3 a2, silu(g) u
};

namespace {

int I(std::size_t n) { return static_cast<int>(n); }

// C[m][n] (+)= A[m][k] B[k][n] with op(A), op(B) as BLAS takes them.
void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* a,
          std::size_t lda, const float* b, std::size_t ldb, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, I(m),
              I(n), I(k), 1.0f, a, I(lda), b, I(ldb), beta, c, I(n));
}

void add(float* y, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace

LmModel::LmModel(const LmConfig& c, TpLayout layout, worker::Communicator* tp)
    : c_(c), layout_(std::move(layout)), tp_(tp) {
  const int t = layout_.tp;
  if ((tp_ == nullptr && t != 1) || (tp_ != nullptr && tp_->size() != t)) {
    throw ConfigError("the LM's tensor-parallel layout is for tp=" + std::to_string(t) +
                      " but the tp group has " + std::to_string(tp_ == nullptr ? 1 : tp_->size()) +
                      " ranks");
  }
  const auto tt = static_cast<std::size_t>(t);
  heads_ = c_.n_heads / tt;
  qdim_ = heads_ * c_.head_dim();
  ffn_ = c_.ffn() / tt;
  vocab_ = c_.tied ? c_.vocab : c_.vocab / tt;
  root_ = c_.n_layers + 1;
  emb_ = 0;
  norm_ = 1 + 9 * c_.n_layers;
  out_ = c_.tied ? emb_ : norm_ + 1;
  blocks_.resize(c_.n_layers);
}

LmModel::~LmModel() = default;

void LmModel::reserve(std::size_t batch) {
  const std::size_t rows = batch * c_.seq_len;
  if (rows <= rows_cap_) return;
  rows_cap_ = rows;
  const std::size_t d = c_.dim;
  for (Block& b : blocks_) {
    b.x.resize(rows * d);
    b.rstd1.resize(rows);
    b.a1.resize(rows * d);
    b.q.resize(rows * qdim_);
    b.k.resize(rows * qdim_);
    b.v.resize(rows * qdim_);
    b.att.resize(batch * heads_ * c_.seq_len * c_.seq_len);
    b.o.resize(rows * qdim_);
    b.mid.resize(rows * d);
    b.rstd2.resize(rows);
    b.a2.resize(rows * d);
    b.g.resize(rows * ffn_);
    b.u.resize(rows * ffn_);
    b.s.resize(rows * ffn_);
  }
  h_.resize(rows * d);
  rstd_.resize(rows);
  hn_.resize(rows * d);
  logits_.resize(rows * vocab_);
  gathered_.resize(rows * c_.vocab);
  dlogits_.resize(rows * c_.vocab);
  dh_.resize(rows * d);
  dx_.resize(rows * d);
  dq_.resize(rows * qdim_);
  dk_.resize(rows * qdim_);
  dv_.resize(rows * qdim_);
  dff_.resize(rows * ffn_);
  dff2_.resize(rows * ffn_);
  do_.resize(rows * qdim_);
  dmid_.resize(rows * d);
}

void LmModel::all_reduce(float* x, std::size_t n) {
  if (tp_ != nullptr) tp_->all_reduce_sum(x, n);
}

// Block l on the stream in h_ (left updated), parameters p of its unit.
void LmModel::block_forward(std::size_t l, const float* p, std::size_t batch) {
  Block& b = blocks_[l];
  const std::size_t rows = batch * c_.seq_len;
  const std::size_t d = c_.dim;
  const std::size_t j = first(l);
  std::copy(h_.begin(), h_.begin() + static_cast<std::ptrdiff_t>(rows * d), b.x.begin());
  cpu::rmsnorm_forward(b.x.data(), tensor(p, j), b.a1.data(), b.rstd1.data(), rows, d, c_.norm_eps);
  gemm(false, true, rows, qdim_, d, b.a1.data(), d, tensor(p, j + 1), d, 0.0f, b.q.data());
  gemm(false, true, rows, qdim_, d, b.a1.data(), d, tensor(p, j + 2), d, 0.0f, b.k.data());
  gemm(false, true, rows, qdim_, d, b.a1.data(), d, tensor(p, j + 3), d, 0.0f, b.v.data());
  cpu::rope_forward(b.q.data(), rows, c_.seq_len, heads_, c_.head_dim(), c_.rope_theta);
  cpu::rope_forward(b.k.data(), rows, c_.seq_len, heads_, c_.head_dim(), c_.rope_theta);
  attention_forward_blas(b.q.data(), b.k.data(), b.v.data(), b.att.data(), b.o.data(), batch,
                         c_.seq_len, heads_, c_.head_dim());
  // Row-parallel wo: this rank's heads' share of the output, summed over the tp group.
  gemm(false, false, rows, d, qdim_, b.o.data(), qdim_, tensor(p, j + 4), d, 0.0f, dx_.data());
  all_reduce(dx_.data(), rows * d);
  for (std::size_t i = 0; i < rows * d; ++i) b.mid[i] = b.x[i] + dx_[i];
  cpu::rmsnorm_forward(b.mid.data(), tensor(p, j + 5), b.a2.data(), b.rstd2.data(), rows, d,
                       c_.norm_eps);
  gemm(false, true, rows, ffn_, d, b.a2.data(), d, tensor(p, j + 6), d, 0.0f, b.g.data());
  gemm(false, true, rows, ffn_, d, b.a2.data(), d, tensor(p, j + 7), d, 0.0f, b.u.data());
  swiglu_forward_vec(b.g.data(), b.u.data(), b.s.data(), rows * ffn_);
  gemm(false, false, rows, d, ffn_, b.s.data(), ffn_, tensor(p, j + 8), d, 0.0f, dx_.data());
  all_reduce(dx_.data(), rows * d);
  for (std::size_t i = 0; i < rows * d; ++i) h_[i] = b.mid[i] + dx_[i];
}

// dh_ holds the gradient of block l's output; left holding that of its input.
void LmModel::block_backward(std::size_t l, const float* p, float* g, std::size_t batch) {
  Block& b = blocks_[l];
  const std::size_t rows = batch * c_.seq_len;
  const std::size_t d = c_.dim;
  const std::size_t j = first(l);
  // Feed-forward: h = mid + w2(silu(w1 a2) * w3 a2).
  gemm(false, true, rows, ffn_, d, dh_.data(), d, tensor(p, j + 8), d, 0.0f, dff_.data());
  gemm(true, false, ffn_, d, rows, b.s.data(), ffn_, dh_.data(), d, 1.0f, tensor(g, j + 8));
  swiglu_backward_vec(dff_.data(), b.g.data(), b.u.data(), dff_.data(), dff2_.data(), rows * ffn_);
  gemm(true, false, ffn_, d, rows, dff_.data(), ffn_, b.a2.data(), d, 1.0f, tensor(g, j + 6));
  gemm(true, false, ffn_, d, rows, dff2_.data(), ffn_, b.a2.data(), d, 1.0f, tensor(g, j + 7));
  gemm(false, false, rows, d, ffn_, dff_.data(), ffn_, tensor(p, j + 6), d, 0.0f, dx_.data());
  gemm(false, false, rows, d, ffn_, dff2_.data(), ffn_, tensor(p, j + 7), d, 1.0f, dx_.data());
  all_reduce(dx_.data(), rows * d);  // column-parallel w1, w3: their inputs' gradient summed
  float* dmid = dmid_.data();
  cpu::rmsnorm_backward(dx_.data(), b.mid.data(), tensor(p, j + 5), b.rstd2.data(), dmid,
                        tensor(g, j + 5), rows, d);
  add(dh_.data(), dmid, rows * d);  // dh_ is now the gradient of mid
  // Attention: mid = x + wo(attention(q, k, v)).
  gemm(false, true, rows, qdim_, d, dh_.data(), d, tensor(p, j + 4), d, 0.0f, dq_.data());
  gemm(true, false, qdim_, d, rows, b.o.data(), qdim_, dh_.data(), d, 1.0f, tensor(g, j + 4));
  std::swap(dq_, do_);  // do_: the gradient of attention's output
  attention_backward_blas(do_.data(), b.q.data(), b.k.data(), b.v.data(), b.att.data(), dq_.data(),
                          dk_.data(), dv_.data(), batch, c_.seq_len, heads_, c_.head_dim());
  cpu::rope_backward(dq_.data(), rows, c_.seq_len, heads_, c_.head_dim(), c_.rope_theta);
  cpu::rope_backward(dk_.data(), rows, c_.seq_len, heads_, c_.head_dim(), c_.rope_theta);
  gemm(true, false, qdim_, d, rows, dq_.data(), qdim_, b.a1.data(), d, 1.0f, tensor(g, j + 1));
  gemm(true, false, qdim_, d, rows, dk_.data(), qdim_, b.a1.data(), d, 1.0f, tensor(g, j + 2));
  gemm(true, false, qdim_, d, rows, dv_.data(), qdim_, b.a1.data(), d, 1.0f, tensor(g, j + 3));
  gemm(false, false, rows, d, qdim_, dq_.data(), qdim_, tensor(p, j + 1), d, 0.0f, dx_.data());
  gemm(false, false, rows, d, qdim_, dk_.data(), qdim_, tensor(p, j + 2), d, 1.0f, dx_.data());
  gemm(false, false, rows, d, qdim_, dv_.data(), qdim_, tensor(p, j + 3), d, 1.0f, dx_.data());
  all_reduce(dx_.data(), rows * d);  // column-parallel wq, wk, wv
  cpu::rmsnorm_backward(dx_.data(), b.x.data(), tensor(p, j), b.rstd1.data(), dmid, tensor(g, j),
                        rows, d);
  add(dh_.data(), dmid, rows * d);
}

double LmModel::forward(UnitMemory& mem, const std::int32_t* tokens, const std::int32_t* targets,
                        std::size_t batch, float scale, bool training) {
  using Pass = UnitMemory::Pass;
  reserve(batch);
  const std::size_t rows = batch * c_.seq_len;
  const std::size_t d = c_.dim;
  for (std::size_t r = 0; r < rows; ++r) {
    if (tokens[r] < 0 || static_cast<std::size_t>(tokens[r]) >= c_.vocab || targets[r] < 0 ||
        static_cast<std::size_t>(targets[r]) >= c_.vocab) {
      throw ConfigError("token " + std::to_string(r) + " outside the vocabulary");
    }
  }
  const float* root = nullptr;
  if (c_.tied) {
    root = mem.acquire(root_, Pass::forward);
    cpu::embedding_forward(tokens, tensor(root, emb_), h_.data(), rows, d);
  } else {
    const float* e = mem.acquire(0, Pass::forward);
    cpu::embedding_forward(tokens, tensor(e, emb_), h_.data(), rows, d);
    mem.release(0, Pass::forward);
  }
  for (std::size_t l = 0; l < c_.n_layers; ++l) {
    block_forward(l, mem.acquire(l + 1, Pass::forward), batch);
    mem.release(l + 1, Pass::forward);
  }
  if (root == nullptr) root = mem.acquire(root_, Pass::forward);
  cpu::rmsnorm_forward(h_.data(), tensor(root, norm_), hn_.data(), rstd_.data(), rows, d,
                       c_.norm_eps);
  const float* out_w = tensor(root, out_);
  gemm(false, true, rows, vocab_, d, hn_.data(), d, out_w, d, 0.0f, logits_.data());
  const float* logits = logits_.data();
  if (!c_.tied && tp_ != nullptr) {
    // Vocabulary-parallel output: gather every rank's columns into the whole logits.
    const std::size_t n = rows * vocab_;
    std::vector<float>& all = dlogits_;  // [tp][rows][vocab_], scratch until the loss
    tp_->all_gather(logits_.data(), all.data(), n * sizeof(float));
    const auto t = static_cast<std::size_t>(layout_.tp);
    for (std::size_t q = 0; q < t; ++q) {
      for (std::size_t r = 0; r < rows; ++r) {
        std::memcpy(gathered_.data() + r * c_.vocab + q * vocab_, all.data() + q * n + r * vocab_,
                    vocab_ * sizeof(float));
      }
    }
    logits = gathered_.data();
  }
  const double loss = cpu::lm_cross_entropy(logits, targets, training ? dlogits_.data() : nullptr,
                                            rows, c_.vocab, scale);
  if (training) {
    root_params_ = root;  // kept until the root's backward
  } else {
    mem.release(root_, Pass::forward);
  }
  return loss;
}

double LmModel::eval_batch(UnitMemory& mem, const std::int32_t* tokens, const std::int32_t* targets,
                           std::size_t batch) {
  return forward(mem, tokens, targets, batch, 1.0f, false);
}

double LmModel::train_batch(UnitMemory& mem, const std::int32_t* tokens,
                            const std::int32_t* targets, std::size_t batch, float scale) {
  using Pass = UnitMemory::Pass;
  const double loss = forward(mem, tokens, targets, batch, scale, true);
  const std::size_t rows = batch * c_.seq_len;
  const std::size_t d = c_.dim;
  // The root: output layer and final norm (acquired since forward).
  const float* root = root_params_;
  float* groot = mem.grads(root_);
  const float* dlog = dlogits_.data();
  if (!c_.tied && tp_ != nullptr) {
    const std::size_t col = static_cast<std::size_t>(layout_.rank) * vocab_;
    for (std::size_t r = 0; r < rows; ++r) {
      std::memcpy(logits_.data() + r * vocab_, dlogits_.data() + r * c_.vocab + col,
                  vocab_ * sizeof(float));
    }
    dlog = logits_.data();  // this rank's columns of the gradient
  }
  gemm(true, false, vocab_, d, rows, dlog, vocab_, hn_.data(), d, 1.0f, tensor(groot, out_));
  gemm(false, false, rows, d, vocab_, dlog, vocab_, tensor(root, out_), d, 0.0f, dx_.data());
  if (!c_.tied) all_reduce(dx_.data(), rows * d);  // column-parallel output
  cpu::rmsnorm_backward(dx_.data(), h_.data(), tensor(root, norm_), rstd_.data(), dh_.data(),
                        tensor(groot, norm_), rows, d);
  if (!c_.tied) {
    mem.release(root_, Pass::backward);
    mem.done(root_);
  }
  for (std::size_t l = c_.n_layers; l-- > 0;) {
    const float* p = mem.acquire(l + 1, Pass::backward);
    block_backward(l, p, mem.grads(l + 1), batch);
    mem.release(l + 1, Pass::backward);
    mem.done(l + 1);
  }
  if (c_.tied) {
    cpu::embedding_backward(tokens, dh_.data(), tensor(groot, emb_), rows, d);
    mem.release(root_, Pass::backward);
    mem.done(root_);
    mem.done(0);
  } else {
    cpu::embedding_backward(tokens, dh_.data(), tensor(mem.grads(0), emb_), rows, d);
    mem.done(0);
  }
  return loss;
}

}  // namespace ddp::train
