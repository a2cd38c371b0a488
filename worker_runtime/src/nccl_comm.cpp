// The NCCL backend of the communicator: rank 0 creates the ncclUniqueId and publishes it in the
// store under key_prefix + "/nccl_id", the others wait for it; then ncclCommInitRank. Buffers
// are device pointers; each call is synchronous on the communicator's stream. Issue 6 makes it
// overlap with compute. Without CUDA the factory says so.
#include <cstring>

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

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw IoError(std::string("cuda: ") + what + ": " + cudaGetErrorString(rc));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const CommOptions& o, int device) : rank_(o.rank), size_(o.size) {
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
    check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce_sum(float* data, std::size_t count) override {
    if (count == 0) return;
    check(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    sync("all_reduce");
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (bytes == 0) return;
    check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    sync("broadcast");
  }
  void barrier() override { all_reduce_sum(scratch_, 1); }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    if (bytes == 0) return;
    check(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
    sync("all_gather");
  }

 private:
  static void check(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess)
      throw IoError(std::string("nccl: ") + what + ": " + ncclGetErrorString(rc));
  }
  void sync(const char* what) { check_cuda(cudaStreamSynchronize(stream_), what); }

  int rank_;
  int size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
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
