// The CUDA engine (see engine.hpp): parameters, gradients and activations on one device;
// matrix products by cuBLAS (fp32, or bf16 inputs with fp32 accumulation for --precision bf16,
// the master weights staying fp32); everything else by our kernels (ddp/kernels/cuda_ops.hpp),
// all on one compute stream. During backward each complete gradient bucket gets an event, and
// NCCL all-reduces it on its own stream behind that event, overlapping the earlier layers'
// backward; the host waits only at the end of the step. Layout and initialisation are the CPU
// Model's, so snapshots move between the two paths.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/kernels/check.hpp"
#include "ddp/kernels/conv_ops.hpp"
#include "ddp/kernels/cuda_ops.hpp"
#include "ddp/kernels/device.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "cuda_net.hpp"
#include "engine.hpp"
#include "reducer.hpp"

namespace ddp::train {
namespace {

namespace gpu = kernels::cuda;
using kernels::cublas;  // loaded at run time (gpu_libraries.hpp)

class CudaEngine final : public Engine {
 public:
  CudaEngine(ModelSpec spec, const OptimizerConfig& opt, worker::Communicator* comm,
             const CudaEngineOptions& o)
      : Engine(std::move(spec), opt),
        device_(o.device),
        max_rows_(o.max_rows),
        reconnect_device_(o.reconnect_device),
        bf16_(o.precision == Precision::bf16),
        buckets_(plan_buckets(model_, std::size_t{1} << 20,
                              static_cast<std::size_t>(o.bucket_cap_mb * 1024 * 1024))) {
    for (const auto& l : model_.spec().layers) {
      if (l.kind != LayerKind::linear || l.pool > 1 || l.dropout > 0.0f) {
        throw ConfigError("--model " + model_.spec().name +
                          ": the CUDA engine runs linear layers only; use --device cpu");
      }
    }
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    if (comm != nullptr && comm->size() > 1) {
      stream_comm_ = dynamic_cast<worker::StreamAllReduce*>(comm);
      if (stream_comm_ == nullptr) {
        throw ConfigError("the CUDA engine reduces gradients with the nccl communicator, not " +
                          std::string(comm->backend()));
      }
      world_ = comm->size();
    }
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DDP_CUBLAS_CHECK(cublas().create(&blas_));
    DDP_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
    const auto& layers = model_.spec().layers;
    const std::size_t n = model_.param_count();
    std::size_t widest = 0;
    for (const auto& l : layers) widest = std::max({widest, l.in, l.out});
    p_.alloc(n);
    g_.alloc(n);
    DDP_CUDA_CHECK(cudaMemsetAsync(g_.get(), 0, n * sizeof(float), stream_));
    state_.alloc(opt_.state().size());
    x_.alloc(max_rows_ * layers.front().in);
    acts_ = std::vector<DeviceBuffer<float>>(layers.size());
    for (std::size_t k = 0; k < layers.size(); ++k) acts_[k].alloc(max_rows_ * layers[k].out);
    delta_.alloc(max_rows_ * widest);
    delta_prev_.alloc(max_rows_ * widest);
    labels_.alloc(max_rows_);
    targets_.alloc(max_rows_ * layers.back().out);
    loss_rows_.alloc(max_rows_);
    if (bf16_) {
      p16_.alloc(n);
      x16_.alloc(max_rows_ * layers.front().in);
      acts16_ = std::vector<DeviceBuffer<std::uint16_t>>(layers.size());
      for (std::size_t k = 0; k < layers.size(); ++k) acts16_[k].alloc(max_rows_ * layers[k].out);
      delta16_.alloc(max_rows_ * widest);
    }
    events_.resize(buckets_.size());
    for (auto& e : events_) {
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    DDP_CUDA_CHECK(cudaMallocHost(&out_host_, max_rows_ * layers.back().out * sizeof(float)));
    cudaDeviceProp prop{};
    DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = prop.name;
  }

  ~CudaEngine() override {
    for (float* slot : loss_host_) cudaFreeHost(slot);
    if (out_host_ != nullptr) cudaFreeHost(out_host_);
    for (auto& e : events_) cudaEventDestroy(e);
    if (blas_ != nullptr) cublas().destroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string device() const override {
    return "cuda:" + std::to_string(device_) + " (" + name_ + ")";
  }
  std::size_t bucket_count() const override { return buckets_.size(); }

  void upload() override {
    DDP_CUDA_CHECK(cudaMemcpyAsync(p_.get(), model_.params().data(),
                                   model_.param_count() * sizeof(float), cudaMemcpyHostToDevice,
                                   stream_));
    if (!opt_.state().empty()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(state_.get(), opt_.state().data(),
                                     opt_.state().size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream_));
    }
    refresh_bf16_weights();
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void download() override {
    DDP_CUDA_CHECK(cudaMemcpyAsync(model_.params().data(), p_.get(),
                                   model_.param_count() * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_));
    if (!opt_.state().empty()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(opt_.state().data(), state_.get(),
                                     opt_.state().size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream_));
    }
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void micro_batch(const float* x, const std::uint8_t* labels, const float* targets,
                   std::size_t rows, float scale, bool sync) override {
    check_rows(rows);
    const auto& spec = model_.spec();
    const std::size_t in = spec.layers.front().in;
    const std::size_t out = spec.layers.back().out;
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(x_.get(), x, rows * in * sizeof(float), cudaMemcpyHostToDevice, stream_));
    if (spec.loss == Loss::cross_entropy) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(labels_.get(), labels, rows, cudaMemcpyHostToDevice, stream_));
    } else if (!spec.autoencoder) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(targets_.get(), targets, rows * out * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_));
    }
    forward(rows);
    float* y = acts_.back().get();
    if (spec.loss == Loss::cross_entropy) {
      gpu::softmax_xent(y, labels_.get(), delta_.get(), loss_rows_.get(), rows, out, scale,
                        stream_);
    } else {
      const float* t = spec.autoencoder ? x_.get() : targets_.get();
      gpu::mse(y, t, delta_.get(), loss_rows_.get(), rows, out, scale / static_cast<float>(out),
               stream_);
    }
    // The loss reaches the host with the step's synchronisation, not now.
    if (micro_ == loss_host_.size()) {
      float* slot = nullptr;
      DDP_CUDA_CHECK(cudaMallocHost(&slot, max_rows_ * sizeof(float)));
      loss_host_.push_back(slot);
      loss_meta_.emplace_back();
    }
    DDP_CUDA_CHECK(cudaMemcpyAsync(loss_host_[micro_], loss_rows_.get(), rows * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    loss_meta_[micro_] = {rows, spec.loss == Loss::cross_entropy ? 1.0 : static_cast<double>(out)};
    ++micro_;
    backward(rows, sync);
  }

  double step() override {
    const std::size_t n = model_.param_count();
    if (stream_comm_ != nullptr) {
      try {
        stream_comm_->wait_all();  // NcclError: the parameters are untouched
      } catch (...) {
        micro_ = 0;  // the step is dropped: its losses and gradients do not carry over
        cudaMemsetAsync(g_.get(), 0, n * sizeof(float), stream_);
        throw;
      }
      gpu::scale(g_.get(), n, 1.0f / static_cast<float>(world_), stream_);
    }
    opt_.set_steps(opt_.steps() + 1);
    const auto& c = opt_.config();
    switch (c.kind) {
      case OptimizerKind::adamw:
        gpu::scale(p_.get(), n, 1.0f - c.lr * c.weight_decay, stream_);
        [[fallthrough]];
      case OptimizerKind::adam:
        gpu::adam_step(p_.get(), g_.get(), state_.get(), state_.get() + n, n, c.lr, c.beta1,
                       c.beta2, c.eps, opt_.steps(), stream_);
        break;
      case OptimizerKind::adadelta:
        gpu::adadelta_step(p_.get(), g_.get(), state_.get(), state_.get() + n, n, c.lr, c.rho,
                           c.ada_eps, stream_);
        break;
      case OptimizerKind::sgd:
        gpu::sgd_step(p_.get(), g_.get(), opt_.state().empty() ? nullptr : state_.get(), n, c.lr,
                      c.momentum, opt_.steps() == 1, stream_);
        break;
    }
    DDP_CUDA_CHECK(cudaMemsetAsync(g_.get(), 0, n * sizeof(float), stream_));
    refresh_bf16_weights();
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    double loss = 0.0;
    for (std::size_t m = 0; m < micro_; ++m) {
      double sum = 0.0;
      for (std::size_t r = 0; r < loss_meta_[m].rows; ++r) sum += loss_host_[m][r];
      loss += sum / loss_meta_[m].divisor / static_cast<double>(loss_meta_[m].rows);
    }
    micro_ = 0;
    return loss;
  }

  // In-place recovery (docs/ddp_train.md): step() already dropped the step (gradients zeroed,
  // losses forgotten) and its NCCL communicator aborted itself. The compute stream is drained,
  // the host communicator and then the device one of the next generation are connected, and
  // the bucket all-reduces go to the new one. The state comes after, through the host copy
  // (download() on the survivor that sends, upload() everywhere).
  bool heal(const std::function<worker::Communicator*()>& reconnect) override {
    if (!reconnect_device_) return false;
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    micro_ = 0;
    DDP_CUDA_CHECK(cudaMemset(g_.get(), 0, model_.param_count() * sizeof(float)));
    stream_comm_ = nullptr;
    reconnect();
    worker::Communicator* comm = reconnect_device_();
    stream_comm_ = dynamic_cast<worker::StreamAllReduce*>(comm);
    if (stream_comm_ == nullptr) {
      throw ConfigError("the CUDA engine reduces gradients with the nccl communicator, not " +
                        std::string(comm->backend()));
    }
    world_ = comm->size();
    return true;
  }

  const float* predict(const float* x, std::size_t rows) override {
    check_rows(rows);
    const std::size_t in = model_.spec().layers.front().in;
    const std::size_t out = model_.spec().layers.back().out;
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(x_.get(), x, rows * in * sizeof(float), cudaMemcpyHostToDevice, stream_));
    forward(rows);
    DDP_CUDA_CHECK(cudaMemcpyAsync(out_host_, acts_.back().get(), rows * out * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out_host_;
  }

 private:
  struct LossMeta {
    std::size_t rows = 0;
    double divisor = 1.0;
  };

  void check_rows(std::size_t rows) const {
    if (rows > max_rows_) {
      throw ConfigError("a batch of " + std::to_string(rows) + " rows is more than the " +
                        std::to_string(max_rows_) + " the CUDA engine was sized for");
    }
  }

  void refresh_bf16_weights() {
    if (bf16_) gpu::f32_to_bf16(p_.get(), p16_.get(), model_.param_count(), stream_);
  }

  // C[m x n] (column-major, ldc) = op(A) op(B) + beta C, with fp32 or bf16 inputs.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n, std::size_t k,
            const float* a, const std::uint16_t* a16, std::size_t lda, const float* b,
            const std::uint16_t* b16, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    const float alpha = 1.0f;
    if (!bf16_) {
      DDP_CUBLAS_CHECK(cublas().sgemm(blas_, ta, tb, as_int(m), as_int(n), as_int(k), &alpha, a,
                                      as_int(lda), b, as_int(ldb), &beta, c, as_int(ldc)));
      return;
    }
    DDP_CUBLAS_CHECK(cublas().gemm_ex(blas_, ta, tb, as_int(m), as_int(n), as_int(k), &alpha, a16,
                                      CUDA_R_16BF, as_int(lda), b16, CUDA_R_16BF, as_int(ldb),
                                      &beta, c, CUDA_R_32F, as_int(ldc), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
  }

  // Row-major matrices are column-major transposes: Y[rows][out] = X W^T is, for cuBLAS,
  // Y^T (out x rows) = W(op T of the in x out array) X^T.
  void forward(std::size_t rows) {
    const auto& layers = model_.spec().layers;
    const auto& slots = model_.slots();
    const float* in = x_.get();
    const std::uint16_t* in16 = nullptr;
    if (bf16_) {
      gpu::f32_to_bf16(x_.get(), x16_.get(), rows * layers.front().in, stream_);
      in16 = x16_.get();
    }
    for (std::size_t k = 0; k < layers.size(); ++k) {
      const LayerSpec& l = layers[k];
      float* y = acts_[k].get();
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, l.out, rows, l.in, p_.get() + slots[k].w,
           bf16_ ? p16_.get() + slots[k].w : nullptr, l.in, in, in16, l.in, 0.0f, y, l.out);
      gpu::bias_act_forward(y, p_.get() + slots[k].b, rows, l.out, to_gpu(l.act), stream_);
      in = y;
      if (bf16_) {
        gpu::f32_to_bf16(y, acts16_[k].get(), rows * l.out, stream_);
        in16 = acts16_[k].get();
      }
    }
  }

  void backward(std::size_t rows, bool sync) {
    const auto& layers = model_.spec().layers;
    const auto& slots = model_.slots();
    std::size_t next_bucket = 0;
    float* delta = delta_.get();  // the loss kernel's gradient, then each layer's input's
    float* prev = delta_prev_.get();
    for (std::size_t k = layers.size(); k-- > 0;) {
      const LayerSpec& l = layers[k];
      gpu::act_backward(delta, acts_[k].get(), rows * l.out, to_gpu(l.act), stream_);
      const float* in = k == 0 ? x_.get() : acts_[k - 1].get();
      const std::uint16_t* in16 = !bf16_ ? nullptr : k == 0 ? x16_.get() : acts16_[k - 1].get();
      if (bf16_) gpu::f32_to_bf16(delta, delta16_.get(), rows * l.out, stream_);
      // dW^T (in x out) += X^T delta ; db += column sums of delta.
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, rows, in, in16, l.in, delta, delta16_.get(),
           l.out, 1.0f, g_.get() + slots[k].w, l.in);
      gpu::sum_rows(delta, g_.get() + slots[k].b, rows, l.out, stream_);
      if (sync && stream_comm_ != nullptr && next_bucket < buckets_.size() &&
          buckets_[next_bucket].last_layer == k) {
        const Bucket& b = buckets_[next_bucket];
        DDP_CUDA_CHECK(cudaEventRecord(events_[next_bucket], stream_));
        stream_comm_->all_reduce_sum_after(g_.get() + b.begin, b.end - b.begin,
                                           events_[next_bucket]);
        ++next_bucket;
      }
      if (k > 0) {
        // d(in)^T (in x rows) = W(in x out array) delta^T
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, l.in, rows, l.out, p_.get() + slots[k].w,
             bf16_ ? p16_.get() + slots[k].w : nullptr, l.in, delta, delta16_.get(), l.out, 0.0f,
             prev, l.in);
        std::swap(delta, prev);
      }
    }
  }

  int device_;
  std::size_t max_rows_;
  std::function<worker::Communicator*()> reconnect_device_;
  bool bf16_;
  std::vector<Bucket> buckets_;
  worker::StreamAllReduce* stream_comm_ = nullptr;
  int world_ = 1;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer<float> p_, g_, state_, x_, delta_, delta_prev_, targets_, loss_rows_;
  DeviceBuffer<std::uint8_t> labels_;
  std::vector<DeviceBuffer<float>> acts_;
  DeviceBuffer<std::uint16_t> p16_, x16_, delta16_;
  std::vector<DeviceBuffer<std::uint16_t>> acts16_;
  std::vector<cudaEvent_t> events_;
  std::vector<float*> loss_host_;  // pinned, one per micro-batch of the step
  std::vector<LossMeta> loss_meta_;
  std::size_t micro_ = 0;
  float* out_host_ = nullptr;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(ModelSpec spec, const OptimizerConfig& opt,
                                         worker::Communicator* comm, const CudaEngineOptions& o) {
  if (kernels::cuda_device_count() == 0) {
    throw ConfigError("--device cuda: no CUDA device is visible to this process");
  }
  return std::make_unique<CudaEngine>(std::move(spec), opt, comm, o);
}

}  // namespace ddp::train
