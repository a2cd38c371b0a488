// The sharded CPU engine (FSDP / ZeRO; levels in shard_layout.hpp, layout of a rank's shard
// there too). Each rank keeps its shard of the optimizer state (opt_, built over the shard) and
// steps only its part of every layer:
//   optimizer  full parameters and gradients as DDP (bucketed all-reduce during backward); the
//              step updates this rank's parts in place, then every layer is all-gathered.
//   gradients  full parameters; each layer's gradients live in a buffer of their own only until
//              backward has finished the layer, then are reduce-scattered into the gradient
//              shard g_ (on the collective thread, overlapping the earlier layers' backward) and
//              freed; the step and the all-gather as above.
//   full       the parameter shard p_ and no full parameters at all: a layer is all-gathered
//              from the shards just before its forward and
//              again before its backward, the next layer's gather posted first (prefetch, as
//              FSDP's forward and backward prefetch), and freed after use (the last layer is kept
//              from forward to backward, as FSDP2 keeps the root's).
// At the replicated levels shard_params() is a copy of this rank's parts made on request (for a
// snapshot, or to be filled by the trainer before upload()), dropped by upload() or the next step.
// Micro-batches before the step's last one (--grad-accum) keep their unsharded gradients, as
// FSDP's no_sync, so each level's step takes the bits --sharding none takes on the shm backend:
// the same sums in the same order, the same element-wise optimizer.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "comm_thread.hpp"
#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/worker/comm.hpp"
#include "engine.hpp"
#include "reducer.hpp"
#include "snapshot.hpp"

namespace ddp::train {
namespace {

ShardLayout layout_for(const ModelSpec& spec, worker::Communicator* comm) {
  const bool many = comm != nullptr && comm->size() > 1;
  return make_shard_layout(layout_slots(spec), many ? comm->size() : 1, many ? comm->rank() : 0);
}

class ShardedEngine final : public Engine, private LayerMemory {
 public:
  ShardedEngine(const ModelSpec& spec, const OptimizerConfig& opt, worker::Communicator* comm,
                Sharding level, bool prefetch, double bucket_cap_mb)
      : Engine(spec, opt, level != Sharding::full, layout_for(spec, comm).shard_size),
        comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr),
        level_(level),
        prefetch_(prefetch),
        layout_(layout_for(spec, comm)) {
    // Gathered layers and gradient buffers of 1 MiB and more are mapped and unmapped whole, so
    // what is freed leaves the process (glibc would otherwise raise its threshold and keep it).
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    const std::size_t layers = model_.spec().layers.size();
    if (level_ == Sharding::full) p_.assign(layout_.shard_size, 0.0f);
    if (level_ != Sharding::optimizer) g_.assign(layout_.shard_size, 0.0f);
    units_.resize(layers);
    unit_ticket_.assign(layers, 0);
    gbuf_.resize(layers);
    rs_ticket_.assign(layers, 0);
    if (level_ != Sharding::optimizer) {
      std::vector<float>().swap(model_.grads());  // gradients live per layer (grads())
      model_.set_memory(this);
    }
    if (level_ == Sharding::optimizer && comm_ != nullptr) {
      buckets_ = plan_buckets(model_, std::size_t{1} << 20,
                              static_cast<std::size_t>(bucket_cap_mb * 1024 * 1024));
      reducer_ = std::make_unique<GradReducer>(comm_, model_.grads().data(), buckets_);
    }
    add((p_.size() + g_.size() + opt_.state().size() + model_.params().size() +
         model_.grads().size()) *
        sizeof(float));
  }

  ~ShardedEngine() override {
    // The collective thread may hold a layer's buffers: it ends (joins) before they do.
    tasks_.reset();
  }

  std::string device() const override { return "cpu"; }
  std::size_t bucket_count() const override {
    return reducer_ != nullptr ? reducer_->buckets().size() : model_.slots().size();
  }
  const ShardLayout* shard_layout() const override { return &layout_; }
  float* shard_params() override {
    if (level_ == Sharding::full) return p_.data();
    if (p_.empty()) {
      p_.resize(layout_.shard_size);
      add(p_.size() * sizeof(float));
    }
    const float* full = model_.params().data();
    for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
      std::copy_n(full + layout_.slots[k].w + layout_.lo[k], layout_.part(k),
                  p_.data() + layout_.local[k]);
    }
    return p_.data();
  }
  Sharding sharding() const override { return level_; }
  bool collective_predict() const override { return level_ == Sharding::full && comm_; }
  std::size_t state_bytes_peak() const override { return peak_.load(); }

  // The shard was set (initialised or read from a snapshot): the replicated levels gather it
  // into their full parameters. Collective.
  void upload() override {
    if (level_ == Sharding::full) return;
    float* full = model_.params().data();
    for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
      std::copy_n(p_.data() + layout_.local[k], layout_.part(k),
                  full + layout_.slots[k].w + layout_.lo[k]);
    }
    drop_shard_copy();
    gather_params();
  }

  void micro_batch(const float* x, const std::uint8_t* labels, const float* targets,
                   std::size_t rows, float scale, bool sync) override {
    sync_ = sync;
    model_.forward(x, rows, true);
    loss_ += model_.loss(labels, targets, rows, scale) / static_cast<double>(rows);
    model_.backward(x, rows, [&](std::size_t k) { layer_done(k); });
  }

  double step() override {
    const float inv = 1.0f / static_cast<float>(layout_.world);
    if (level_ == Sharding::optimizer) {
      if (reducer_ != nullptr) reducer_->finish();  // averaged over the ranks
    } else {
      tasks_->wait_all();  // every layer's reduce-scatter
      std::fill(rs_ticket_.begin(), rs_ticket_.end(), 0);
      if (comm_ != nullptr) kernels::cpu::scale(g_.data(), g_.size(), inv);
    }
    if (level_ == Sharding::full) {
      opt_.step(p_.data(), g_.data());
    } else {
      // This rank's part of every layer, in place in the full parameters.
      drop_shard_copy();
      std::vector<Optimizer::Part> parts;
      float* full = model_.params().data();
      for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
        const std::size_t at = layout_.slots[k].w + layout_.lo[k];
        const float* g = level_ == Sharding::optimizer ? model_.grads().data() + at
                                                       : g_.data() + layout_.local[k];
        parts.push_back({full + at, g, layout_.local[k], layout_.part(k)});
      }
      opt_.step(parts);
      if (level_ == Sharding::optimizer) model_.zero_grads();
      gather_params();
    }
    const double loss = loss_;
    loss_ = 0.0;
    return loss;
  }

  // In-place recovery: the collective thread and the reducer go first (they may hold the old
  // communicator), then what the dropped step left (gathered layers, gradients, its loss). The
  // shard itself is restored by the trainer from the copies (heal_shards, checkpoint.hpp).
  bool heal(const std::function<worker::Communicator*()>& reconnect) override {
    tasks_.reset();
    reducer_.reset();
    for (std::size_t k = 0; k < units_.size(); ++k) {
      sub(units_[k].size() * sizeof(float));
      std::vector<float>().swap(units_[k]);
      sub(gbuf_[k].size() * sizeof(float));
      std::vector<float>().swap(gbuf_[k]);
    }
    std::fill(unit_ticket_.begin(), unit_ticket_.end(), 0);
    std::fill(rs_ticket_.begin(), rs_ticket_.end(), 0);
    std::fill(g_.begin(), g_.end(), 0.0f);
    if (level_ == Sharding::optimizer) model_.zero_grads();
    loss_ = 0.0;
    tasks_ = std::make_unique<CommThread>();
    comm_ = reconnect();
    if (level_ == Sharding::optimizer) {
      reducer_ = std::make_unique<GradReducer>(comm_, model_.grads().data(), buckets_);
    }
    return true;
  }

  const float* predict(const float* x, std::size_t rows) override {
    training_ = false;
    const float* out = model_.forward(x, rows, false);
    training_ = true;
    return out;
  }

  std::uint64_t param_checksum() override {
    if (level_ != Sharding::full) return Engine::param_checksum();
    std::uint64_t h = fnv1a64(nullptr, 0);
    std::vector<float> whole;
    for (std::size_t k = layout_.slots.size(); k-- > 0;) {  // the flat layout's order
      whole.resize(layout_.slots[k].size());
      tasks_->wait(tasks_->post([&, k] { gather(k, whole.data()); }));
      h = fnv1a64(whole.data(), whole.size() * sizeof(float), h);
    }
    return h;
  }

 private:
  // LayerMemory: where the model finds layer k.
  const float* acquire(std::size_t k, Pass pass) override {
    if (level_ != Sharding::full) return model_.params().data() + model_.slots()[k].w;
    request(k);
    if (prefetch_ && pass == Pass::forward && k + 1 < units_.size()) request(k + 1);
    if (prefetch_ && pass == Pass::backward && k > 0) request(k - 1);
    tasks_->wait(unit_ticket_[k]);
    return units_[k].data();
  }

  void release(std::size_t k, Pass pass) override {
    if (level_ != Sharding::full) return;
    if (pass == Pass::forward && training_ && k + 1 == units_.size()) return;  // backward's first
    sub(units_[k].size() * sizeof(float));
    std::vector<float>().swap(units_[k]);
    unit_ticket_[k] = 0;
  }

  float* grads(std::size_t k) override {
    if (level_ == Sharding::optimizer) return model_.grads().data() + model_.slots()[k].w;
    if (gbuf_[k].empty()) {
      // Back-pressure: at most kGradsInFlight layers' gradients wait for their reduce-scatter
      // (else backward, which gradients' level never blocks, would outrun the network and
      // hold nearly every layer's gradients at once).
      const std::size_t behind = k + kGradsInFlight;
      if (behind < rs_ticket_.size() && rs_ticket_[behind] != 0) tasks_->wait(rs_ticket_[behind]);
      gbuf_[k].assign(layout_.slots[k].size(), 0.0f);
      add(gbuf_[k].size() * sizeof(float));
    }
    return gbuf_[k].data();
  }

  // Backward finished layer k's gradients: on the step's last micro-batch they go to their
  // owners (the bucketed all-reduce, or this layer's reduce-scatter, after which its buffer is
  // freed by the collective thread; the model does not touch it again before step()).
  void layer_done(std::size_t k) {
    if (!sync_) return;
    if (level_ == Sharding::optimizer) {
      if (reducer_ != nullptr) reducer_->layer_done(k);
      return;
    }
    rs_ticket_[k] = tasks_->post([this, k] {
      float* out = g_.data() + layout_.local[k];
      if (comm_ != nullptr) {
        comm_->reduce_scatter_sum(gbuf_[k].data(), out, layout_.counts[k]);
      } else {
        std::copy_n(gbuf_[k].data(), layout_.part(k), out);
      }
      sub(gbuf_[k].size() * sizeof(float));
      std::vector<float>().swap(gbuf_[k]);
    });
  }

  // Posts layer k's all-gather into a buffer of its own unless it is there or on its way.
  void request(std::size_t k) {
    if (unit_ticket_[k] != 0) return;
    units_[k].resize(layout_.slots[k].size());
    add(units_[k].size() * sizeof(float));
    float* out = units_[k].data();
    unit_ticket_[k] = tasks_->post([this, k, out] { gather(k, out); });
  }

  // Layer k's slot, whole, into out (collective on the collective thread).
  void gather(std::size_t k, float* out) {
    const float* mine = p_.data() + layout_.local[k];
    if (comm_ != nullptr) {
      comm_->all_gather_v(mine, out, layout_.counts[k]);
    } else {
      std::copy_n(mine, layout_.part(k), out);
    }
  }

  // The replicated levels' full parameters from every rank's part, in place.
  void gather_params() {
    float* full = model_.params().data();
    for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
      float* out = full + layout_.slots[k].w;
      tasks_->post([this, k, out] {
        if (comm_ != nullptr) comm_->all_gather_v(out + layout_.lo[k], out, layout_.counts[k]);
      });
    }
    tasks_->wait_all();
  }

  void drop_shard_copy() {
    if (level_ == Sharding::full || p_.empty()) return;
    sub(p_.size() * sizeof(float));
    std::vector<float>().swap(p_);
  }

  void add(std::size_t bytes) {
    const std::size_t now = live_.fetch_add(bytes) + bytes;
    std::size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  void sub(std::size_t bytes) { live_.fetch_sub(bytes); }

  worker::Communicator* comm_;  // null for one rank
  Sharding level_;
  bool prefetch_;
  ShardLayout layout_;
  std::vector<float> p_;  // full: this rank's shard of the parameters (else a copy on request)
  std::vector<float> g_;  // gradients, full: this rank's shard of the averaged gradients
  std::vector<std::vector<float>> units_;  // full: gathered layers
  std::vector<std::uint64_t> unit_ticket_;
  std::vector<std::vector<float>> gbuf_;  // gradients / full: a layer's unsharded gradients
  std::vector<std::uint64_t> rs_ticket_;  // their reduce-scatters posted this step
  static constexpr std::size_t kGradsInFlight = 2;
  std::vector<Bucket> buckets_;           // optimizer: the reducer's plan, kept for a heal
  std::unique_ptr<GradReducer> reducer_;  // optimizer: DDP's bucketed all-reduce
  std::unique_ptr<CommThread> tasks_ = std::make_unique<CommThread>();
  bool sync_ = true;
  bool training_ = true;
  double loss_ = 0.0;
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> peak_{0};
};

}  // namespace

std::unique_ptr<Engine> make_sharded_engine(ModelSpec spec, const OptimizerConfig& opt,
                                            worker::Communicator* comm, Sharding level,
                                            bool prefetch, double bucket_cap_mb) {
  return std::make_unique<ShardedEngine>(spec, opt, comm, level, prefetch, bucket_cap_mb);
}

}  // namespace ddp::train
