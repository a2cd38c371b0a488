// The arithmetic of one step on a CUDA device, for the sharded CUDA engine
// (cuda_sharded_engine.cpp): one compute stream and its cuBLAS handle, the batch and activation
// buffers (sized for max_rows), and forward, loss and backward of a stack of linear layers whose
// parameters and gradients live wherever a DeviceLayers says (gathered layers, shards). The
// products and kernels are the CUDA engine's (cuda_engine.cpp): fp32 cuBLAS, or bf16 inputs
// with fp32 accumulation, the rest fp32. Everything is enqueued on the compute stream; only
// predict() waits for it. Also the device pieces the sharded engine builds on: buffers, a
// stream-ordered pool, events, and the optimizer kernel over a piece of the parameters.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/kernels/check.hpp"
#include "ddp/kernels/cuda_ops.hpp"
#include "model.hpp"
#include "optimizer.hpp"

namespace ddp::train {

// The model's activation as the kernels' enum (cuda_engine.cpp and cuda_net.cpp share it).
inline kernels::cuda::Act to_gpu(Act a) {
  using G = kernels::cuda::Act;
  return a == Act::relu ? G::relu : a == Act::sigmoid ? G::sigmoid : G::none;
}
// A size as the int that cuBLAS and the kernels take (sizes are bounded well below INT_MAX).
inline int as_int(std::size_t v) { return static_cast<int>(v); }

// cudaMalloc'd memory of `count` T (at least one), freed with the object.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void alloc(std::size_t count) {
    DDP_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// Device memory that comes and goes during a step (gathered layers, a layer's gradients): a pool
// of its own, allocated and freed in the order of `stream` (cudaMallocFromPoolAsync /
// cudaFreeAsync: no device-wide synchronisation, which can deadlock against NCCL's kernels),
// which keeps freed memory for reuse as torch's caching allocator does. It also counts the bytes
// live (with what the owner add()s for its fixed buffers) and their peak; thread-safe.
class DevicePool {
 public:
  DevicePool(int device, cudaStream_t stream);
  ~DevicePool();  // allocations still out go with the pool
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // The memory is the stream's from here on: another stream may use it only after an event
  // recorded on the stream after this call.
  template <typename T>
  T* alloc(std::size_t count) {
    return static_cast<T*>(alloc_bytes(count * sizeof(T)));
  }
  // Reused only by what is enqueued on the stream after this call.
  void free(void* ptr, std::size_t bytes);
  void add(std::size_t bytes);
  void sub(std::size_t bytes) { live_.fetch_sub(bytes); }
  std::size_t peak() const { return peak_.load(); }

 private:
  void* alloc_bytes(std::size_t bytes);
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t stream_;
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> peak_{0};
};

// cudaEvents (timing off), destroyed with the set.
class EventSet {
 public:
  EventSet() = default;
  EventSet(const EventSet&) = delete;
  EventSet& operator=(const EventSet&) = delete;
  ~EventSet();
  cudaEvent_t make();

 private:
  std::vector<cudaEvent_t> events_;
};

// opt's kernel over `count` elements (the step count already advanced): parameters p, gradients
// g, and the state arrays s0 (SGD's momentum, Adam's m, Adadelta's square_avg; null for SGD
// without momentum) and s1 (Adam's v, Adadelta's acc_delta) at the same offset.
void optimizer_kernel(const Optimizer& opt, float* p, const float* g, float* s0, float* s1,
                      std::size_t count, cudaStream_t stream);

// Where the net finds layer k (slot layout: weight, then bias). Calls come in CudaNet's order:
// forward acquires and releases layers 0, 1, ...; backward acquires layer k, adds into
// grads(k), calls layer_done(k) once those gradients are enqueued, then releases k, from the
// last layer down. Pointers are device memory, valid on the compute stream until release.
class DeviceLayers {
 public:
  enum class Pass { forward, backward };
  struct Weights {
    const float* f32 = nullptr;           // the slot in fp32
    const std::uint16_t* bf16 = nullptr;  // the slot in bf16 (a bf16 net only)
  };
  virtual ~DeviceLayers() = default;
  virtual Weights acquire(std::size_t k, Pass pass) = 0;
  virtual void release(std::size_t k, Pass pass) = 0;
  virtual float* grads(std::size_t k) = 0;
  virtual void layer_done(std::size_t k) = 0;
};

class CudaNet {
 public:
  // Throws ConfigError for a layer the CUDA path lacks (conv, pooling, dropout).
  CudaNet(const ModelSpec& spec, int device, std::size_t max_rows, bool bf16);
  ~CudaNet();
  CudaNet(const CudaNet&) = delete;
  CudaNet& operator=(const CudaNet&) = delete;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  const std::string& device_name() const { return name_; }
  bool bf16() const { return bf16_; }

  // Copies the micro-batch in; forward, the loss (its gradient scaled by `scale`; the per-row
  // losses go to pinned host memory) and backward, all enqueued on the stream.
  void train(const float* x, const std::uint8_t* labels, const float* targets, std::size_t rows,
             float scale, DeviceLayers& layers);
  // After the stream has been synchronised: the sum over the micro-batches since the last call
  // of (summed loss / rows). drop_loss() forgets them (a failed step).
  double take_loss();
  void drop_loss() { micro_ = 0; }
  // The model's output for x, in pinned host memory owned by the net (synchronises).
  const float* predict(const float* x, std::size_t rows, DeviceLayers& layers);

 private:
  struct LossMeta {
    std::size_t rows = 0;
    double divisor = 1.0;
  };
  void check_rows(std::size_t rows) const;
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n, std::size_t k,
            const float* a, const std::uint16_t* a16, std::size_t lda, const float* b,
            const std::uint16_t* b16, std::size_t ldb, float beta, float* c, std::size_t ldc);
  void forward(std::size_t rows, DeviceLayers& layers);
  void backward(std::size_t rows, DeviceLayers& layers);

  ModelSpec spec_;
  int device_;
  std::size_t max_rows_;
  bool bf16_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer<float> x_, delta_, delta_prev_, targets_, loss_rows_;
  DeviceBuffer<std::uint8_t> labels_;
  std::vector<DeviceBuffer<float>> acts_;
  DeviceBuffer<std::uint16_t> x16_, delta16_;
  std::vector<DeviceBuffer<std::uint16_t>> acts16_;
  std::vector<float*> loss_host_;  // pinned, one per micro-batch of the step
  std::vector<LossMeta> loss_meta_;
  std::size_t micro_ = 0;
  float* out_host_ = nullptr;
};

}  // namespace ddp::train
