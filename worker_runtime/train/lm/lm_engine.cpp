// The language model's engine on a dp x tp mesh: sharding along dp, optimizer, snapshots'
// owned ranges (lm_engine.hpp).
#include "lm_engine.hpp"

#include <algorithm>
#include <cstring>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "shard_snapshot.hpp"

namespace ddp::train {
namespace {

// Unit u's dp parts: counts over the dp ranks and their offsets within the unit.
struct UnitCut {
  std::vector<std::size_t> counts;
  std::vector<std::size_t> offsets;
};

std::vector<UnitCut> unit_cuts(const TpLayout& l, int dp) {
  std::vector<UnitCut> cuts(l.unit_begin.size());
  for (std::size_t u = 0; u < cuts.size(); ++u) {
    cuts[u].counts = worker::even_shards(l.unit_end[u] - l.unit_begin[u], dp);
    cuts[u].offsets = worker::shard_offsets("lm unit", cuts[u].counts, dp);
  }
  return cuts;
}

// Where rank d's owned local intervals of each tensor come from: for tensor j, the local
// interval [a, b) (within the tp-local vector) and its canonical start.
struct Owned {
  std::size_t local_lo = 0, local_hi = 0;  // in the tp-local vector
  std::size_t canon_lo = 0;
};
std::vector<Owned> owned_intervals(const TpLayout& l, const std::vector<UnitCut>& cuts, int d) {
  std::vector<Owned> out(l.tensors.size());
  const auto q = static_cast<std::size_t>(d);
  for (std::size_t j = 0; j < l.tensors.size(); ++j) {
    const std::size_t u = l.tensors[j].unit;
    if (l.tensors[j].split == TpSplit::replicated && l.rank != 0) continue;
    const std::size_t part_lo = l.unit_begin[u] + cuts[u].offsets[q];
    const std::size_t part_hi = part_lo + cuts[u].counts[q];
    const std::size_t a = std::max(part_lo, l.local[j]);
    const std::size_t b = std::min(part_hi, l.local[j] + l.part(j));
    if (a >= b) continue;
    out[j] = {a, b, l.lo[j] + (a - l.local[j])};
  }
  return out;
}

}  // namespace

FileRanges lm_owned_ranges(const LmConfig& c, int dp, int tp, int d, int t) {
  const TpLayout l = make_tp_layout(c, tp, t);
  const std::vector<Owned> own = owned_intervals(l, unit_cuts(l, dp), d);
  FileRanges r(own.size());
  for (std::size_t j = 0; j < own.size(); ++j) {
    r[j] = {own[j].canon_lo, own[j].canon_lo + (own[j].local_hi - own[j].local_lo)};
  }
  return r;
}

// Where the model's units live. Replicated parameters (none, optimizer, gradients): the whole
// tp-local vector; full: only this rank's shard, each unit gathered when acquired. Gradients:
// the whole local vector (none, optimizer: all-reduced per unit as it completes), or a unit's
// buffer reduce-scattered into the shard's (gradients, full).
class LmEngine::Memory final : public UnitMemory {
 public:
  Memory(const TpLayout& l, worker::Communicator* dp, Sharding level)
      : l_(l), dp_(dp), level_(level), d_(dp != nullptr ? dp->size() : 1) {
    cuts_ = unit_cuts(l_, d_);
    const auto q = static_cast<std::size_t>(dp != nullptr ? dp->rank() : 0);
    shard_off_.assign(cuts_.size() + 1, 0);
    for (std::size_t u = 0; u < cuts_.size(); ++u) {
      shard_off_[u + 1] = shard_off_[u] + cuts_[u].counts[q];
    }
    rank_ = q;
    if (level_ != Sharding::full) params_.assign(l_.local_size, 0.0f);
    if (level_ == Sharding::none || level_ == Sharding::optimizer) {
      grads_.assign(l_.local_size, 0.0f);
    }
    if (level_ != Sharding::none) shard_grads_.assign(shard_size(), 0.0f);
    if (level_ == Sharding::full) shard_params_.assign(shard_size(), 0.0f);
    bufs_.resize(cuts_.size());
    gbufs_.resize(cuts_.size());
  }

  std::size_t shard_size() const { return shard_off_.back(); }
  std::size_t unit_size(std::size_t u) const { return l_.unit_end[u] - l_.unit_begin[u]; }
  // This rank's part of unit u: [part_lo, part_lo + part_n) of the unit.
  std::size_t part_lo(std::size_t u) const { return cuts_[u].offsets[rank_]; }
  std::size_t part_n(std::size_t u) const { return cuts_[u].counts[rank_]; }

  const float* acquire(std::size_t u, Pass) override {
    if (level_ != Sharding::full) return params_.data() + l_.unit_begin[u];
    std::vector<float>& b = bufs_[u];
    b.resize(unit_size(u));
    gather(shard_params_.data() + shard_off_[u], b.data(), u);
    return b.data();
  }
  void release(std::size_t u, Pass) override {
    if (level_ == Sharding::full) std::vector<float>().swap(bufs_[u]);
  }
  float* grads(std::size_t u) override {
    if (!grads_.empty()) return grads_.data() + l_.unit_begin[u];
    std::vector<float>& g = gbufs_[u];
    if (g.size() != unit_size(u)) g.assign(unit_size(u), 0.0f);
    return g.data();
  }
  void done(std::size_t u) override {
    const std::size_t n = unit_size(u);
    if (!grads_.empty()) {
      if (dp_ != nullptr && n > 0) dp_->all_reduce_sum(grads_.data() + l_.unit_begin[u], n);
      return;
    }
    float* g = grads(u);
    float* out = shard_grads_.data() + shard_off_[u];
    if (dp_ != nullptr) {
      if (n > 0) dp_->reduce_scatter_sum(g, out, cuts_[u].counts);
    } else {
      std::copy(g, g + n, out);
    }
    std::vector<float>().swap(gbufs_[u]);
  }

  void gather(const float* part, float* whole, std::size_t u) {
    const std::size_t n = unit_size(u);
    if (n == 0) return;
    if (dp_ != nullptr) {
      if (part != whole + part_lo(u)) std::copy(part, part + part_n(u), whole + part_lo(u));
      dp_->all_gather_v(whole + part_lo(u), whole, cuts_[u].counts);
    } else if (part != whole) {
      std::copy(part, part + n, whole);
    }
  }

  // The optimizer's view: one part per unit (or the whole local vector at level none).
  void step(Optimizer& opt) {
    if (level_ == Sharding::none) {
      opt.step(params_.data(), grads_.data());
      return;
    }
    std::vector<Optimizer::Part> parts;
    for (std::size_t u = 0; u < cuts_.size(); ++u) {
      float* p = level_ == Sharding::full ? shard_params_.data() + shard_off_[u]
                                          : params_.data() + l_.unit_begin[u] + part_lo(u);
      const float* g = level_ == Sharding::optimizer ? grads_.data() + l_.unit_begin[u] + part_lo(u)
                                                     : shard_grads_.data() + shard_off_[u];
      parts.push_back({p, g, shard_off_[u], part_n(u)});
    }
    opt.step(parts);
    if (level_ == Sharding::full) return;
    for (std::size_t u = 0; u < cuts_.size(); ++u) {
      float* whole = params_.data() + l_.unit_begin[u];
      gather(whole + part_lo(u), whole, u);
    }
  }

  void zero_grads() {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    std::fill(shard_grads_.begin(), shard_grads_.end(), 0.0f);
  }

  // Local element i of the tp-local vector, where this rank keeps it: its value's address, or
  // null when it is another dp rank's (full sharding).
  float* local_param(std::size_t i) {
    if (level_ != Sharding::full) return params_.data() + i;
    const std::size_t u = unit_of(i);
    const std::size_t off = i - l_.unit_begin[u];
    if (off < part_lo(u) || off >= part_lo(u) + part_n(u)) return nullptr;
    return shard_params_.data() + shard_off_[u] + (off - part_lo(u));
  }
  // Index of local element i in the optimizer's state (only for elements this rank steps).
  std::size_t state_index(std::size_t i) const {
    if (level_ == Sharding::none) return i;
    const std::size_t u = unit_of(i);
    return shard_off_[u] + (i - l_.unit_begin[u] - part_lo(u));
  }
  std::size_t unit_of(std::size_t i) const {
    std::size_t u = 0;
    while (u + 1 < cuts_.size() && i >= l_.unit_end[u]) ++u;
    return u;
  }
  std::size_t opt_size() const { return level_ == Sharding::none ? l_.local_size : shard_size(); }
  const std::vector<UnitCut>& cuts() const { return cuts_; }

 private:
  const TpLayout& l_;
  worker::Communicator* dp_;
  Sharding level_;
  int d_;
  std::size_t rank_ = 0;
  std::vector<UnitCut> cuts_;
  std::vector<std::size_t> shard_off_;
  std::vector<float> params_, grads_, shard_params_, shard_grads_;
  std::vector<std::vector<float>> bufs_, gbufs_;
};

LmEngine::LmEngine(const LmConfig& c, worker::Communicator* tp, worker::Communicator* dp,
                   Sharding level, const OptimizerConfig& opt)
    : c_(c), level_(level), dp_(dp) {
  dp_size_ = dp != nullptr ? dp->size() : 1;
  dp_rank_ = dp != nullptr ? dp->rank() : 0;
  model_ = std::make_unique<LmModel>(
      c_, make_tp_layout(c_, tp != nullptr ? tp->size() : 1, tp != nullptr ? tp->rank() : 0), tp);
  mem_ = std::make_unique<Memory>(model_->layout(), dp_, level_);
  opt_ = std::make_unique<Optimizer>(opt, mem_->opt_size());
}

LmEngine::~LmEngine() = default;

const LmConfig& LmEngine::config() const { return c_; }
const TpLayout& LmEngine::layout() const { return model_->layout(); }

void LmEngine::init(std::uint64_t seed) {
  const TpLayout& l = layout();
  std::vector<float> part;
  for (std::size_t j = 0; j < l.tensors.size(); ++j) {
    part.resize(l.part(j));
    lm_init_slice(c_, seed, j, l.lo[j], l.hi[j], part.data());
    for (std::size_t i = 0; i < part.size(); ++i) {
      if (float* p = mem_->local_param(l.local[j] + i)) *p = part[i];
    }
  }
}

double LmEngine::step(const std::int32_t* tokens, const std::int32_t* targets, std::size_t batch,
                      float scale) {
  mem_->zero_grads();
  const double loss = model_->train_batch(*mem_, tokens, targets, batch, scale);
  mem_->step(*opt_);
  return loss;
}

double LmEngine::eval(const std::int32_t* tokens, const std::int32_t* targets, std::size_t batch) {
  return model_->eval_batch(*mem_, tokens, targets, batch);
}

void LmEngine::owned(float* params, float* opt, int pieces) const {
  const TpLayout& l = layout();
  const std::vector<Owned> own = owned_intervals(l, mem_->cuts(), dp_rank_);
  std::size_t n = 0;
  for (const Owned& o : own) n += o.local_hi - o.local_lo;
  const std::vector<float>& state = opt_->state();
  const std::size_t sn = mem_->opt_size();
  std::size_t k = 0;
  for (const Owned& o : own) {
    for (std::size_t i = o.local_lo; i < o.local_hi; ++i, ++k) {
      params[k] = *mem_->local_param(i);
      if (opt == nullptr) continue;
      const std::size_t s = mem_->state_index(i);
      for (int q = 0; q < pieces; ++q) {
        opt[static_cast<std::size_t>(q) * n + k] = state[static_cast<std::size_t>(q) * sn + s];
      }
    }
  }
}

void LmEngine::load(const SnapshotReader& r, bool with_state) {
  const TpLayout& l = layout();
  const int pieces = with_state ? r.pieces() : 0;
  std::vector<float> local(l.local_size);
  std::vector<std::vector<float>> state(static_cast<std::size_t>(pieces),
                                        std::vector<float>(l.local_size));
  for (std::size_t j = 0; j < l.tensors.size(); ++j) {
    std::vector<float*> opt;
    for (auto& s : state) opt.push_back(s.data() + l.local[j]);
    r.read(j, l.lo[j], l.hi[j], local.data() + l.local[j], opt);
  }
  std::vector<float>& st = opt_->state();
  const std::size_t sn = mem_->opt_size();
  const Sharding lv = level_;
  for (std::size_t i = 0; i < l.local_size; ++i) {
    float* p = mem_->local_param(i);
    if (p == nullptr) continue;
    *p = local[i];
    if (pieces == 0) continue;
    // The optimizer steps only this rank's part at the sharded levels.
    if (lv != Sharding::none) {
      const std::size_t u = mem_->unit_of(i);
      const std::size_t off = i - l.unit_begin[u];
      if (off < mem_->part_lo(u) || off >= mem_->part_lo(u) + mem_->part_n(u)) continue;
    }
    const std::size_t s = mem_->state_index(i);
    for (int q = 0; q < pieces; ++q) {
      st[static_cast<std::size_t>(q) * sn + s] = state[static_cast<std::size_t>(q)][i];
    }
  }
}

std::pair<double, double> LmEngine::fingerprint() {
  const TpLayout& l = layout();
  const std::vector<Owned> own = owned_intervals(l, mem_->cuts(), dp_rank_);
  double v[2] = {0.0, 0.0};
  for (const Owned& o : own) {
    for (std::size_t i = o.local_lo; i < o.local_hi; ++i) {
      const double x = *mem_->local_param(i);
      v[0] += x;
      v[1] += x * x;
    }
  }
  // Summed over dp, then over tp: every element is owned by exactly one rank.
  auto sum_over = [&v](worker::Communicator* c) {
    if (c == nullptr) return;
    std::vector<double> all(2 * static_cast<std::size_t>(c->size()));
    c->all_gather(v, all.data(), sizeof v);
    v[0] = v[1] = 0.0;
    for (std::size_t q = 0; q < all.size(); q += 2) {
      v[0] += all[q];
      v[1] += all[q + 1];
    }
  };
  sum_over(dp_);
  sum_over(model_->tp());
  return {v[0], v[1]};
}

}  // namespace ddp::train
