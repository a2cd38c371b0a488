// The NCCL backend of the communicator: rank 0 creates the ncclUniqueId and publishes it in the
// store under key_prefix + "/nccl_id", the others wait for it; then a non-blocking
// ncclCommInitRankConfig. Buffers are device pointers; each call waits for its own stream,
// polling for asynchronous errors, and aborts the communicator on a failure or a timeout.
// Without CUDA the factory says so.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/comm.hpp"

#if defined(DDP_WITH_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace ddp::worker {

#if defined(DDP_WITH_CUDA)
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw IoError(std::string("cuda: ") + what + ": " + cudaGetErrorString(rc));
  }
}

// A non-blocking NCCL communicator (ncclConfig_t::blocking = 0): every wait polls the stream and
// ncclCommGetAsyncError, so a dead peer or a timeout ends in ncclCommAbort and an IoError within
// CommOptions::timeout, never in a hang until NCCL's own watchdog.
class NcclCommunicator final : public Communicator, public StreamAllReduce {
 public:
  NcclCommunicator(const CommOptions& o, int device)
      : rank_(o.rank), size_(o.size), timeout_(o.timeout) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    const std::string key = o.key_prefix + "/nccl_id";
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      o.store->set(key, std::string_view(id.internal, sizeof id.internal));
    } else {
      o.store->wait({key}, o.timeout);
      const std::string bytes = o.store->get(key);
      if (bytes.size() != sizeof id.internal) {
        throw IoError("nccl: the unique id in the store under '" + key + "' has " +
                      std::to_string(bytes.size()) + " bytes, expected " +
                      std::to_string(sizeof id.internal));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    wait_ready("ncclCommInitRankConfig");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ == nullptr || aborted_) return;
    // Non-blocking: finalize may be in progress; poll it (bounded), then destroy. On an error
    // or a timeout, abort instead, so a gone peer cannot hang the teardown.
    bool clean = ncclCommFinalize(comm_) != ncclSystemError;
    const auto deadline = Clock::now() + std::min(timeout_, std::chrono::milliseconds(30000));
    ncclResult_t state = ncclInProgress;
    while (clean) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) clean = false;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || Clock::now() > deadline) clean = false;
      std::this_thread::yield();
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce_sum(float* data, std::size_t count) override {
    if (count == 0) return;
    enqueue(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_),
            "ncclAllReduce");
    wait_stream("all_reduce");
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (bytes == 0) return;
    enqueue(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    wait_stream("broadcast");
  }
  void barrier() override { all_reduce_sum(scratch_, 1); }

  void all_reduce_sum_after(float* data, std::size_t count, void* ready_event) override {
    if (count == 0) return;
    check_cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready_event), 0),
               "cudaStreamWaitEvent");
    enqueue(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_),
            "ncclAllReduce");
  }
  void wait_all() override { wait_stream("bucket all_reduce"); }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    if (bytes == 0) return;
    enqueue(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
    wait_stream("all_gather");
  }

 private:
  void check(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess && rc != ncclInProgress) fail(what, ncclGetErrorString(rc));
  }
  void enqueue(ncclResult_t rc, const char* what) {
    if (aborted_) throw IoError(std::string("nccl ") + what + ": the communicator was aborted");
    check(rc, what);
    wait_ready(what);
  }
  // Non-blocking calls may return ncclInProgress: poll until the call itself completes.
  void wait_ready(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, ncclGetErrorString(state));
      if (Clock::now() > deadline) fail(what, "timed out");
      std::this_thread::yield();
    }
  }
  // Waits for the stream's work, watching for asynchronous errors (a peer gone) meanwhile.
  void wait_stream(const char* what) {
    if (aborted_) throw IoError(std::string("nccl ") + what + ": the communicator was aborted");
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) fail(what, cudaGetErrorString(rc));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) fail(what, ncclGetErrorString(state));
      if (Clock::now() > deadline) fail(what, "timed out (a peer stopped?)");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  [[noreturn]] void fail(const char* what, const char* why) {
    if (comm_ != nullptr && !aborted_) {
      ncclCommAbort(comm_);  // frees this rank's side; the peers' waits fail in turn
      aborted_ = true;
    }
    throw IoError(std::string("nccl ") + what + " on rank " + std::to_string(rank_) + " of " +
                  std::to_string(size_) + " failed: " + why + "; the communicator was aborted");
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options, int device) {
  if (!options.store) throw ConfigError("nccl: no store to bootstrap through");
  return std::make_unique<NcclCommunicator>(options, device);
}
#else
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions&, int) {
  throw ConfigError(
      "--backend nccl: this ddprun was built without CUDA (DDP_WITH_CUDA=OFF); "
      "use --backend gloo");
}
#endif

}  // namespace ddp::worker
