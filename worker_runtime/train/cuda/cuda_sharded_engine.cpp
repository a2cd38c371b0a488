// The sharded CUDA engine: FSDP / ZeRO on GPUs (levels and the shard layout in shard_layout.hpp;
// the CPU twin is sharded_engine.cpp). Each rank keeps on its device its fp32 shard of the
// optimizer state, and the fused optimizer kernels step only its part of every layer (the fp32
// master weights):
//   optimizer  full parameters and gradients on the device, as the CUDA engine's DDP (bucket
//              all-reduces behind compute-stream events); the step updates this rank's parts of
//              the full parameters in place, then every layer is all-gathered in place.
//   gradients  full parameters; a layer's gradients live in a buffer of their own until backward
//              has finished the layer, are then reduce-scattered into the gradient shard (on the
//              collective thread, overlapping the earlier layers' backward) and freed; the step
//              and the all-gather as above.
//   full       parameter and gradient shards, no full parameters: a layer is all-gathered into
//              a buffer of its own just before its forward and again before its backward (the
//              next layer's gather posted first: prefetch) and freed after use; the last layer
//              is kept from forward to backward.
// --precision bf16 casts the full parameters after each gather, or a gathered layer, to bf16 for
// the products; shards, gradients and optimizer state stay fp32 (FSDP's mixed precision with
// fp32 master weights). Micro-batches before the step's last keep their unsharded gradients,
// as FSDP's no_sync.
//
// Ordering. Compute is one stream (CudaNet). The communicator's collectives (NCCL, on device
// pointers) run on its own stream and return once done (the communicator polls with its
// timeout). The overlapped ones, a layer's gather or reduce-scatter, run on the collective
// thread (comm_thread.hpp) after a host wait for an event recorded on the compute stream where
// their buffers became ready, so they overlap the compute queued behind that event. The compute
// stream never waits on NCCL's stream: before a gathered layer's first use the host waits for
// its gather (one host wait per layer with full sharding, hidden by the prefetch), and step()
// waits for every reduce-scatter before stepping. A dead peer thus ends in an NcclError from a
// host wait, never in a stream stuck forever. Layer buffers come from a DevicePool on the
// compute stream (cuda_net.hpp: stream-ordered, no device-wide synchronisation). A communicator
// of one rank is used as any other (the tests run the NCCL path on one GPU); without one, the
// collectives are copies on the compute stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm_thread.hpp"
#include "cuda_net.hpp"
#include "ddp/kernels/check.hpp"
#include "ddp/kernels/cuda_ops.hpp"
#include "ddp/kernels/device.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "engine.hpp"
#include "reducer.hpp"
#include "snapshot.hpp"

namespace ddp::train {
namespace {

namespace gpu = kernels::cuda;
using Pass = DeviceLayers::Pass;

ShardLayout layout_for(const ModelSpec& spec, worker::Communicator* comm) {
  return make_shard_layout(layout_slots(spec), comm != nullptr ? comm->size() : 1,
                           comm != nullptr ? comm->rank() : 0);
}

class CudaShardedEngine final : public Engine, private DeviceLayers {
 public:
  CudaShardedEngine(const ModelSpec& spec, const OptimizerConfig& opt, worker::Communicator* comm,
                    Sharding level, bool prefetch, const CudaEngineOptions& o)
      : Engine(spec, opt, false, layout_for(spec, comm).shard_size),
        comm_(comm),
        level_(level),
        prefetch_(prefetch),
        layout_(layout_for(spec, comm)),
        net_(model_.spec(), o.device, o.max_rows, o.precision == Precision::bf16),
        pool_(net_.device(), net_.stream()) {
    if (comm_ != nullptr) {
      // Device pointers: the nccl communicator (the one that is a StreamAllReduce).
      stream_comm_ = dynamic_cast<worker::StreamAllReduce*>(comm_);
      if (stream_comm_ == nullptr) {
        throw ConfigError("--sharding on the CUDA engine needs the nccl communicator, not " +
                          std::string(comm_->backend()));
      }
      tasks_ = std::make_unique<CommThread>();
    }
    const std::size_t n = model_.param_count();
    const std::size_t shard = layout_.shard_size;
    const std::size_t layers = layout_.slots.size();
    cudaStream_t s = net_.stream();
    p_.assign(shard, 0.0f);
    dstate_.alloc(opt_.state().size());
    std::size_t bytes = opt_.state().size() * sizeof(float);
    if (level_ == Sharding::full) {
      dp_.alloc(shard);
      bytes += shard * sizeof(float);
    }
    if (level_ != Sharding::optimizer) {
      dg_.alloc(shard);
      bytes += shard * sizeof(float);
    }
    if (level_ != Sharding::full) {
      full_.alloc(n);
      bytes += n * sizeof(float);
      if (net_.bf16()) {
        full16_.alloc(n);
        bytes += n * sizeof(std::uint16_t);
      }
    }
    if (level_ == Sharding::optimizer) {
      gfull_.alloc(n);
      bytes += n * sizeof(float);
      DDP_CUDA_CHECK(cudaMemsetAsync(gfull_.get(), 0, n * sizeof(float), s));
      buckets_ = plan_buckets(model_, std::size_t{1} << 20,
                              static_cast<std::size_t>(o.bucket_cap_mb * 1024 * 1024));
      for (std::size_t b = 0; b < buckets_.size(); ++b) bucket_ready_.push_back(events_.make());
    }
    units_.assign(layers, nullptr);
    units16_.assign(layers, nullptr);
    unit_ticket_.assign(layers, 0);
    gbuf_.assign(layers, nullptr);
    for (std::size_t k = 0; k < layers; ++k) {
      unit_ready_.push_back(events_.make());
      grad_ready_.push_back(events_.make());
    }
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));
    pool_.add(bytes);
  }

  ~CudaShardedEngine() override {
    tasks_.reset();  // the collective thread ends (joins) before what its tasks use
    cudaStream_t s = net_.stream();
    for (std::size_t k = 0; k < units_.size(); ++k) {
      if (units_[k] != nullptr) cudaFreeAsync(units_[k], s);
      if (units16_[k] != nullptr) cudaFreeAsync(units16_[k], s);
      if (gbuf_[k] != nullptr) cudaFreeAsync(gbuf_[k], s);
    }
    cudaStreamSynchronize(s);  // then the pool goes, with what skipped tasks never freed
  }

  std::string device() const override {
    return "cuda:" + std::to_string(net_.device()) + " (" + net_.device_name() + ")";
  }
  std::size_t bucket_count() const override {
    return level_ == Sharding::optimizer && comm_ != nullptr ? buckets_.size()
                                                             : layout_.slots.size();
  }
  const ShardLayout* shard_layout() const override { return &layout_; }
  float* shard_params() override { return p_.data(); }
  Sharding sharding() const override { return level_; }
  bool collective_predict() const override {
    return level_ == Sharding::full && comm_ != nullptr && comm_->size() > 1;
  }
  std::size_t state_bytes_peak() const override { return pool_.peak(); }

  // The host shard and optimizer state were set: onto the device, and the replicated levels
  // gather their full parameters. Collective.
  void upload() override {
    cudaStream_t s = net_.stream();
    for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(param_part(k), p_.data() + layout_.local[k],
                                     layout_.part(k) * sizeof(float), cudaMemcpyHostToDevice, s));
    }
    auto& st = opt_.state();
    if (!st.empty()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(dstate_.get(), st.data(), st.size() * sizeof(float),
                                     cudaMemcpyHostToDevice, s));
    }
    if (level_ != Sharding::full) gather_params();
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  // The device's shard and optimizer state back to shard_params() and optimizer().state().
  void download() override {
    cudaStream_t s = net_.stream();
    for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(p_.data() + layout_.local[k], param_part(k),
                                     layout_.part(k) * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    auto& st = opt_.state();
    if (!st.empty()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(st.data(), dstate_.get(), st.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, s));
    }
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void micro_batch(const float* x, const std::uint8_t* labels, const float* targets,
                   std::size_t rows, float scale, bool sync) override {
    sync_ = sync;
    next_bucket_ = 0;
    net_.train(x, labels, targets, rows, scale, *this);
  }

  double step() override {
    cudaStream_t s = net_.stream();
    const std::size_t n = model_.param_count();
    try {
      if (level_ == Sharding::optimizer && comm_ != nullptr) {
        stream_comm_->wait_all();  // every bucket's all-reduce
      } else if (tasks_ != nullptr) {
        tasks_->wait_all();  // every layer's reduce-scatter
      }
    } catch (...) {
      // The step is dropped (the parameters are untouched): its losses and gradients do not
      // carry over.
      net_.drop_loss();
      if (level_ == Sharding::optimizer) cudaMemsetAsync(gfull_.get(), 0, n * sizeof(float), s);
      throw;
    }
    if (layout_.world > 1) {  // the sums to means
      const float inv = 1.0f / static_cast<float>(layout_.world);
      if (level_ == Sharding::optimizer) {
        gpu::scale(gfull_.get(), n, inv, s);
      } else {
        gpu::scale(dg_.get(), layout_.shard_size, inv, s);
      }
    }
    optimizer_step();
    if (level_ == Sharding::optimizer) {
      DDP_CUDA_CHECK(cudaMemsetAsync(gfull_.get(), 0, n * sizeof(float), s));
    }
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));  // the losses; the new shard, for the gathers
    if (level_ != Sharding::full) gather_params();
    return net_.take_loss();
  }

  const float* predict(const float* x, std::size_t rows) override {
    training_ = false;  // full: the last layer is freed after its forward too
    try {
      const float* out = net_.predict(x, rows, *this);
      training_ = true;
      return out;
    } catch (...) {
      training_ = true;
      throw;
    }
  }

  std::uint64_t param_checksum() override {
    if (tasks_ != nullptr) tasks_->wait_all();
    cudaStream_t s = net_.stream();
    std::vector<float> host;
    if (level_ != Sharding::full) {  // the full parameters are on the device
      host.resize(model_.param_count());
      DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), full_.get(), host.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, s));
      DDP_CUDA_CHECK(cudaStreamSynchronize(s));
      return fnv1a64(host.data(), host.size() * sizeof(float));
    }
    std::uint64_t h = fnv1a64(nullptr, 0);
    for (std::size_t k = layout_.slots.size(); k-- > 0;) {  // the flat layout's order
      const std::size_t size = layout_.slots[k].size();
      float* whole = pool_.alloc<float>(size);
      gather_now(k, whole);
      host.resize(size);
      DDP_CUDA_CHECK(
          cudaMemcpyAsync(host.data(), whole, size * sizeof(float), cudaMemcpyDeviceToHost, s));
      pool_.free(whole, size * sizeof(float));
      DDP_CUDA_CHECK(cudaStreamSynchronize(s));
      h = fnv1a64(host.data(), size * sizeof(float), h);
    }
    return h;
  }

 private:
  // DeviceLayers: where the net finds layer k.
  Weights acquire(std::size_t k, Pass pass) override {
    if (level_ != Sharding::full) {
      const std::size_t w = layout_.slots[k].w;
      return {full_.get() + w, net_.bf16() ? full16_.get() + w : nullptr};
    }
    request(k);
    if (prefetch_ && pass == Pass::forward && k + 1 < units_.size()) request(k + 1);
    if (prefetch_ && pass == Pass::backward && k > 0) request(k - 1);
    if (tasks_ != nullptr) tasks_->wait(unit_ticket_[k]);  // the host waits for k's gather
    if (net_.bf16() && units16_[k] == nullptr) {
      const std::size_t size = layout_.slots[k].size();
      units16_[k] = pool_.alloc<std::uint16_t>(size);
      gpu::f32_to_bf16(units_[k], units16_[k], size, net_.stream());
    }
    return {units_[k], units16_[k]};
  }

  void release(std::size_t k, Pass pass) override {
    if (level_ != Sharding::full) return;
    if (pass == Pass::forward && training_ && k + 1 == units_.size()) return;  // backward's first
    const std::size_t size = layout_.slots[k].size();
    pool_.free(std::exchange(units_[k], nullptr), size * sizeof(float));
    if (units16_[k] != nullptr) {
      pool_.free(std::exchange(units16_[k], nullptr), size * sizeof(std::uint16_t));
    }
    unit_ticket_[k] = 0;
  }

  float* grads(std::size_t k) override {
    if (level_ == Sharding::optimizer) return gfull_.get() + layout_.slots[k].w;
    if (gbuf_[k] == nullptr) {
      const std::size_t size = layout_.slots[k].size();
      gbuf_[k] = pool_.alloc<float>(size);
      DDP_CUDA_CHECK(cudaMemsetAsync(gbuf_[k], 0, size * sizeof(float), net_.stream()));
    }
    return gbuf_[k];
  }

  // Backward has enqueued layer k's gradients: on the step's last micro-batch they go to their
  // owners (the bucket's all-reduce once the bucket is complete, or this layer's reduce-scatter,
  // after which the collective thread frees the layer's buffer).
  void layer_done(std::size_t k) override {
    if (!sync_) return;
    cudaStream_t s = net_.stream();
    if (level_ == Sharding::optimizer) {
      if (comm_ != nullptr && next_bucket_ < buckets_.size() &&
          buckets_[next_bucket_].last_layer == k) {
        const Bucket& b = buckets_[next_bucket_];
        DDP_CUDA_CHECK(cudaEventRecord(bucket_ready_[next_bucket_], s));
        stream_comm_->all_reduce_sum_after(gfull_.get() + b.begin, b.end - b.begin,
                                           bucket_ready_[next_bucket_]);
        ++next_bucket_;
      }
      return;
    }
    float* buf = std::exchange(gbuf_[k], nullptr);
    float* out = dg_.get() + layout_.local[k];
    const std::size_t bytes = layout_.slots[k].size() * sizeof(float);
    if (comm_ == nullptr) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(out, buf + layout_.lo[k], layout_.part(k) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, s));
      pool_.free(buf, bytes);
      return;
    }
    cudaEvent_t ready = grad_ready_[k];
    DDP_CUDA_CHECK(cudaEventRecord(ready, s));
    tasks_->post([this, k, buf, out, bytes, ready] {
      on_thread();
      DDP_CUDA_CHECK(cudaEventSynchronize(ready));             // backward has written the gradients
      comm_->reduce_scatter_sum(buf, out, layout_.counts[k]);  // returns once NCCL is done
      pool_.free(buf, bytes);
    });
  }

  // Posts layer k's all-gather into a buffer of its own unless it is there or on its way.
  void request(std::size_t k) {
    if (units_[k] != nullptr) return;
    const std::size_t size = layout_.slots[k].size();
    float* out = pool_.alloc<float>(size);
    units_[k] = out;
    const float* mine = param_part(k);
    cudaStream_t s = net_.stream();
    if (comm_ == nullptr) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(out, mine, size * sizeof(float), cudaMemcpyDeviceToDevice, s));
      return;
    }
    cudaEvent_t ready = unit_ready_[k];
    DDP_CUDA_CHECK(cudaEventRecord(ready, s));  // the buffer is the layer's from here on
    unit_ticket_[k] = tasks_->post([this, k, mine, out, ready] {
      on_thread();
      DDP_CUDA_CHECK(cudaEventSynchronize(ready));
      comm_->all_gather_v(mine, out, layout_.counts[k]);
    });
  }

  // Layer k's slot, whole, into out now (the collective thread idle), for the compute stream.
  void gather_now(std::size_t k, float* out) {
    cudaStream_t s = net_.stream();
    const float* mine = param_part(k);
    if (comm_ == nullptr) {
      DDP_CUDA_CHECK(
          cudaMemcpyAsync(out, mine, layout_.part(k) * sizeof(float), cudaMemcpyDeviceToDevice, s));
      return;
    }
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));  // what the compute stream wrote or reads is done
    comm_->all_gather_v(mine, out, layout_.counts[k]);
  }

  // The replicated levels' full parameters from every rank's parts of them (collective, in
  // place; one rank's parts are the whole), then their bf16 copy.
  void gather_params() {
    if (tasks_ != nullptr) tasks_->wait_all();
    float* full = full_.get();
    if (comm_ != nullptr) {
      DDP_CUDA_CHECK(cudaStreamSynchronize(net_.stream()));  // the parts are written
      for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
        comm_->all_gather_v(param_part(k), full + layout_.slots[k].w, layout_.counts[k]);
      }
    }
    if (net_.bf16()) {
      gpu::f32_to_bf16(full, full16_.get(), model_.param_count(), net_.stream());
    }
  }

  // Where this rank's part of layer k's parameters is (the master weights), and its averaged
  // gradients: in the shards (full; gradients for the gradients), or in place in the full
  // buffers.
  float* param_part(std::size_t k) const {
    return level_ == Sharding::full ? dp_.get() + layout_.local[k]
                                    : full_.get() + layout_.slots[k].w + layout_.lo[k];
  }
  const float* grad_part(std::size_t k) const {
    return level_ == Sharding::optimizer ? gfull_.get() + layout_.slots[k].w + layout_.lo[k]
                                         : dg_.get() + layout_.local[k];
  }

  // One optimizer step over this rank's part of every layer (element-wise: one kernel per part,
  // the state of part k at local[k] of each state array).
  void optimizer_step() {
    const std::size_t n = layout_.shard_size;
    const std::size_t pieces = n == 0 ? 0 : opt_.state().size() / n;
    float* s0 = pieces >= 1 ? dstate_.get() : nullptr;
    float* s1 = pieces >= 2 ? dstate_.get() + n : nullptr;
    opt_.set_steps(opt_.steps() + 1);
    for (std::size_t k = 0; k < layout_.slots.size(); ++k) {
      const std::size_t o = layout_.local[k];
      if (layout_.part(k) == 0) continue;
      optimizer_kernel(opt_, param_part(k), grad_part(k), s0 != nullptr ? s0 + o : nullptr,
                       s1 != nullptr ? s1 + o : nullptr, layout_.part(k), net_.stream());
    }
  }

  // The collective thread's CUDA calls are for this engine's device.
  void on_thread() const { DDP_CUDA_CHECK(cudaSetDevice(net_.device())); }

  worker::Communicator* comm_;  // null: one rank, collectives are copies
  worker::StreamAllReduce* stream_comm_ = nullptr;
  Sharding level_;
  bool prefetch_;
  ShardLayout layout_;
  CudaNet net_;
  std::vector<float> p_;              // the host copy of the parameter shard (shard_params())
  DeviceBuffer<float> dstate_;        // the optimizer state's shard
  DeviceBuffer<float> dp_, dg_;       // full: the parameter shard; gradients, full: gradient shard
  DeviceBuffer<float> full_, gfull_;  // optimizer, gradients: full parameters (and gradients)
  DeviceBuffer<std::uint16_t> full16_;  // their bf16 copy
  std::vector<Bucket> buckets_;         // optimizer: DDP's buckets
  std::vector<cudaEvent_t> bucket_ready_;
  std::size_t next_bucket_ = 0;
  std::vector<float*> units_;  // full: gathered layers (pool memory)
  std::vector<std::uint16_t*> units16_;
  std::vector<std::uint64_t> unit_ticket_;
  std::vector<cudaEvent_t> unit_ready_;
  std::vector<float*> gbuf_;  // gradients, full: a layer's unsharded gradients (pool memory)
  std::vector<cudaEvent_t> grad_ready_;
  EventSet events_;  // every event above
  DevicePool pool_;  // layers and gradients that come and go, on the compute stream
  bool sync_ = true;
  bool training_ = true;
  std::unique_ptr<CommThread> tasks_;  // null without a communicator; declared last, ends first
};

}  // namespace

std::unique_ptr<Engine> make_cuda_sharded_engine(ModelSpec spec, const OptimizerConfig& opt,
                                                 worker::Communicator* comm, Sharding level,
                                                 bool prefetch, const CudaEngineOptions& o) {
  if (level == Sharding::none) return make_cuda_engine(std::move(spec), opt, comm, o);
  if (kernels::cuda_device_count() == 0) {
    throw ConfigError("--device cuda: no CUDA device is visible to this process");
  }
  return std::make_unique<CudaShardedEngine>(spec, opt, comm, level, prefetch, o);
}

}  // namespace ddp::train
