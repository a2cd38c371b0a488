// One step's arithmetic on a CUDA device (see cuda_net.hpp); the same calls, in the same order,
// as the CUDA engine's forward and backward (cuda_engine.cpp), with the layers' memory asked of
// a DeviceLayers.
#include "cuda_net.hpp"

#include <limits>

#include "ddp/kernels/conv_ops.hpp"
#include "ddp/kernels/cuda_ops.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::train {
namespace {

namespace gpu = kernels::cuda;
using kernels::cublas;  // loaded at run time (gpu_libraries.hpp)

}  // namespace

DevicePool::DevicePool(int device, cudaStream_t stream) : stream_(stream) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  DDP_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();  // freed memory stays pooled
  DDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
}

DevicePool::~DevicePool() {
  if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
}

void* DevicePool::alloc_bytes(std::size_t bytes) {
  void* ptr = nullptr;
  DDP_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr, std::max<std::size_t>(bytes, 4), pool_, stream_));
  add(bytes);
  return ptr;
}

void DevicePool::free(void* ptr, std::size_t bytes) {
  DDP_CUDA_CHECK(cudaFreeAsync(ptr, stream_));
  sub(bytes);
}

void DevicePool::add(std::size_t bytes) {
  const std::size_t now = live_.fetch_add(bytes) + bytes;
  std::size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

EventSet::~EventSet() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t EventSet::make() {
  cudaEvent_t e = nullptr;
  DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  events_.push_back(e);
  return e;
}

void optimizer_kernel(const Optimizer& opt, float* p, const float* g, float* s0, float* s1,
                      std::size_t count, cudaStream_t stream) {
  const OptimizerConfig& c = opt.config();
  switch (c.kind) {
    case OptimizerKind::adamw:
      gpu::scale(p, count, 1.0f - c.lr * c.weight_decay, stream);
      [[fallthrough]];
    case OptimizerKind::adam:
      gpu::adam_step(p, g, s0, s1, count, c.lr, c.beta1, c.beta2, c.eps, opt.steps(), stream);
      break;
    case OptimizerKind::adadelta:
      gpu::adadelta_step(p, g, s0, s1, count, c.lr, c.rho, c.ada_eps, stream);
      break;
    case OptimizerKind::sgd:
      gpu::sgd_step(p, g, s0, count, c.lr, c.momentum, opt.steps() == 1, stream);
      break;
  }
}

CudaNet::CudaNet(const ModelSpec& spec, int device, std::size_t max_rows, bool bf16)
    : spec_(spec), device_(device), max_rows_(max_rows), bf16_(bf16) {
  for (const auto& l : spec_.layers) {
    if (l.kind != LayerKind::linear || l.pool > 1 || l.dropout > 0.0f) {
      throw ConfigError("--model " + spec_.name +
                        ": the CUDA engine runs linear layers only; use --device cpu");
    }
  }
  DDP_CUDA_CHECK(cudaSetDevice(device_));
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DDP_CUBLAS_CHECK(cublas().create(&blas_));
  DDP_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
  const auto& layers = spec_.layers;
  std::size_t widest = 0;
  for (const auto& l : layers) widest = std::max({widest, l.in, l.out});
  x_.alloc(max_rows_ * layers.front().in);
  acts_ = std::vector<DeviceBuffer<float>>(layers.size());
  for (std::size_t k = 0; k < layers.size(); ++k) acts_[k].alloc(max_rows_ * layers[k].out);
  delta_.alloc(max_rows_ * widest);
  delta_prev_.alloc(max_rows_ * widest);
  labels_.alloc(max_rows_);
  targets_.alloc(max_rows_ * layers.back().out);
  loss_rows_.alloc(max_rows_);
  if (bf16_) {
    x16_.alloc(max_rows_ * layers.front().in);
    acts16_ = std::vector<DeviceBuffer<std::uint16_t>>(layers.size());
    for (std::size_t k = 0; k < layers.size(); ++k) acts16_[k].alloc(max_rows_ * layers[k].out);
    delta16_.alloc(max_rows_ * widest);
  }
  DDP_CUDA_CHECK(cudaMallocHost(&out_host_, max_rows_ * layers.back().out * sizeof(float)));
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  name_ = prop.name;
}

CudaNet::~CudaNet() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (float* slot : loss_host_) cudaFreeHost(slot);
  if (out_host_ != nullptr) cudaFreeHost(out_host_);
  if (blas_ != nullptr) cublas().destroy(blas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaNet::check_rows(std::size_t rows) const {
  if (rows > max_rows_) {
    throw ConfigError("a batch of " + std::to_string(rows) + " rows is more than the " +
                      std::to_string(max_rows_) + " the CUDA engine was sized for");
  }
}

void CudaNet::train(const float* x, const std::uint8_t* labels, const float* targets,
                    std::size_t rows, float scale, DeviceLayers& layers) {
  check_rows(rows);
  const std::size_t in = spec_.layers.front().in;
  const std::size_t out = spec_.layers.back().out;
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(x_.get(), x, rows * in * sizeof(float), cudaMemcpyHostToDevice, stream_));
  if (spec_.loss == Loss::cross_entropy) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(labels_.get(), labels, rows, cudaMemcpyHostToDevice, stream_));
  } else if (!spec_.autoencoder) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(targets_.get(), targets, rows * out * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
  }
  forward(rows, layers);
  float* y = acts_.back().get();
  if (spec_.loss == Loss::cross_entropy) {
    gpu::softmax_xent(y, labels_.get(), delta_.get(), loss_rows_.get(), rows, out, scale, stream_);
  } else {
    const float* t = spec_.autoencoder ? x_.get() : targets_.get();
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
  loss_meta_[micro_] = {rows, spec_.loss == Loss::cross_entropy ? 1.0 : static_cast<double>(out)};
  ++micro_;
  backward(rows, layers);
}

double CudaNet::take_loss() {
  double loss = 0.0;
  for (std::size_t m = 0; m < micro_; ++m) {
    double sum = 0.0;
    for (std::size_t r = 0; r < loss_meta_[m].rows; ++r) sum += loss_host_[m][r];
    loss += sum / loss_meta_[m].divisor / static_cast<double>(loss_meta_[m].rows);
  }
  micro_ = 0;
  return loss;
}

const float* CudaNet::predict(const float* x, std::size_t rows, DeviceLayers& layers) {
  check_rows(rows);
  const std::size_t in = spec_.layers.front().in;
  const std::size_t out = spec_.layers.back().out;
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(x_.get(), x, rows * in * sizeof(float), cudaMemcpyHostToDevice, stream_));
  forward(rows, layers);
  DDP_CUDA_CHECK(cudaMemcpyAsync(out_host_, acts_.back().get(), rows * out * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out_host_;
}

// C[m x n] (column-major, ldc) = op(A) op(B) + beta C, with fp32 or bf16 inputs.
void CudaNet::gemm(cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n,
                   std::size_t k, const float* a, const std::uint16_t* a16, std::size_t lda,
                   const float* b, const std::uint16_t* b16, std::size_t ldb, float beta, float* c,
                   std::size_t ldc) {
  const float alpha = 1.0f;
  if (!bf16_) {
    DDP_CUBLAS_CHECK(cublas().sgemm(blas_, ta, tb, as_int(m), as_int(n), as_int(k), &alpha, a,
                                    as_int(lda), b, as_int(ldb), &beta, c, as_int(ldc)));
    return;
  }
  DDP_CUBLAS_CHECK(cublas().gemm_ex(blas_, ta, tb, as_int(m), as_int(n), as_int(k), &alpha, a16,
                                    CUDA_R_16BF, as_int(lda), b16, CUDA_R_16BF, as_int(ldb), &beta,
                                    c, CUDA_R_32F, as_int(ldc), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}

// Row-major matrices are column-major transposes: Y[rows][out] = X W^T is, for cuBLAS,
// Y^T (out x rows) = W(op T of the in x out array) X^T.
void CudaNet::forward(std::size_t rows, DeviceLayers& layers) {
  const auto& specs = spec_.layers;
  const float* in = x_.get();
  const std::uint16_t* in16 = nullptr;
  if (bf16_) {
    gpu::f32_to_bf16(x_.get(), x16_.get(), rows * specs.front().in, stream_);
    in16 = x16_.get();
  }
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const LayerSpec& l = specs[k];
    const DeviceLayers::Weights w = layers.acquire(k, DeviceLayers::Pass::forward);
    float* y = acts_[k].get();
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, l.out, rows, l.in, w.f32, w.bf16, l.in, in, in16, l.in, 0.0f, y,
         l.out);
    gpu::bias_act_forward(y, w.f32 + l.weight_count(), rows, l.out, to_gpu(l.act), stream_);
    layers.release(k, DeviceLayers::Pass::forward);
    in = y;
    if (bf16_) {
      gpu::f32_to_bf16(y, acts16_[k].get(), rows * l.out, stream_);
      in16 = acts16_[k].get();
    }
  }
}

void CudaNet::backward(std::size_t rows, DeviceLayers& layers) {
  const auto& specs = spec_.layers;
  float* delta = delta_.get();  // the loss kernel's gradient, then each layer's input's
  float* prev = delta_prev_.get();
  for (std::size_t k = specs.size(); k-- > 0;) {
    const LayerSpec& l = specs[k];
    const DeviceLayers::Weights w = layers.acquire(k, DeviceLayers::Pass::backward);
    gpu::act_backward(delta, acts_[k].get(), rows * l.out, to_gpu(l.act), stream_);
    const float* in = k == 0 ? x_.get() : acts_[k - 1].get();
    const std::uint16_t* in16 = !bf16_ ? nullptr : k == 0 ? x16_.get() : acts16_[k - 1].get();
    if (bf16_) gpu::f32_to_bf16(delta, delta16_.get(), rows * l.out, stream_);
    // dW^T (in x out) += X^T delta ; db += column sums of delta.
    float* g = layers.grads(k);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, rows, in, in16, l.in, delta, delta16_.get(), l.out,
         1.0f, g, l.in);
    gpu::sum_rows(delta, g + l.weight_count(), rows, l.out, stream_);
    layers.layer_done(k);
    if (k > 0) {
      // d(in)^T (in x rows) = W(in x out array) delta^T
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, l.in, rows, l.out, w.f32, w.bf16, l.in, delta, delta16_.get(),
           l.out, 0.0f, prev, l.in);
      std::swap(delta, prev);
    }
    layers.release(k, DeviceLayers::Pass::backward);
  }
}

}  // namespace ddp::train
