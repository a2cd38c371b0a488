// The NCCL backend of the communicator: rank 0 creates the ncclUniqueId and publishes it in the
// store under key_prefix + "/nccl_id", the others wait for it; then a non-blocking
// ncclCommInitRankConfig. Buffers are device pointers; each call waits for its own stream,
// polling for asynchronous errors, and aborts the communicator on a failure or a timeout (then
// throws ddp::NcclError). Calls are checked with ddp/kernels/check.hpp's macros. Sharded
// collectives: equal parts are ncclReduceScatter / ncclAllGather; uneven ones a group of one
// ncclReduce / ncclBroadcast per rank (no padding, no staging memory), as torch does for its
// uneven NCCL collectives. Without CUDA the factory says so.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/comm.hpp"

#if defined(DDP_WITH_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>

#include "ddp/kernels/check.hpp"
#endif

namespace ddp::worker {

#if defined(DDP_WITH_CUDA)
namespace {

using Clock = std::chrono::steady_clock;
using kernels::nccl;  // loaded at run time (gpu_libraries.hpp)

// A non-blocking NCCL communicator (ncclConfig_t::blocking = 0): every wait polls the stream and
// ncclCommGetAsyncError, so a dead peer or a timeout ends in ncclCommAbort and an NcclError
// within CommOptions::timeout, never in a hang until NCCL's own watchdog.
class NcclCommunicator final : public Communicator, public StreamAllReduce {
 public:
  NcclCommunicator(const CommOptions& o, int device)
      : rank_(o.rank), size_(o.size), timeout_(o.timeout), interrupted_(o.interrupted) {
    nccl();  // a missing NCCL is named here, before the store or the device are touched
    DDP_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id{};
    const std::string key = o.key_prefix + "/nccl_id";
    if (rank_ == 0) {
      DDP_NCCL_CHECK(nccl().get_unique_id(&id));
      o.store->set(key, std::string_view(id.internal, sizeof id.internal));
    } else {
      o.store->wait({key}, o.timeout);
      const std::string bytes = o.store->get(key);
      if (bytes.size() != sizeof id.internal) {
        throw NcclError("nccl: the unique id in the store under '" + key + "' has " +
                        std::to_string(bytes.size()) + " bytes, expected " +
                        std::to_string(sizeof id.internal));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    live("ncclCommInitRankConfig", [&] {
      DDP_NCCL_CHECK_NONBLOCKING(nccl().comm_init_rank_config(&comm_, size_, id, rank_, &config));
    });
    wait_ready("ncclCommInitRankConfig");
    live("the communicator's stream", [&] {
      DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      DDP_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    });
  }
  ~NcclCommunicator() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ == nullptr || aborted_) return;
    // Non-blocking: finalize may be in progress; poll it (bounded), then destroy. On an error
    // or a timeout, abort instead, so a gone peer cannot hang the teardown.
    bool clean = nccl().comm_finalize(comm_) != ncclSystemError;
    const auto deadline = Clock::now() + std::min(timeout_, std::chrono::milliseconds(30000));
    ncclResult_t state = ncclInProgress;
    while (clean) {
      if (nccl().comm_get_async_error(comm_, &state) != ncclSuccess) clean = false;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || Clock::now() > deadline) clean = false;
      std::this_thread::yield();
    }
    if (clean) {
      nccl().comm_destroy(comm_);
    } else {
      nccl().comm_abort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce_sum(float* data, std::size_t count) override {
    if (count == 0) return;
    enqueue("ncclAllReduce", [&] {
      DDP_NCCL_CHECK_NONBLOCKING(
          nccl().all_reduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_));
    });
    wait_stream("all_reduce");
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (bytes == 0) return;
    enqueue("ncclBroadcast", [&] {
      DDP_NCCL_CHECK_NONBLOCKING(
          nccl().broadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    });
    wait_stream("broadcast");
  }
  void barrier() override { all_reduce_sum(scratch_, 1); }

  void all_reduce_sum_after(float* data, std::size_t count, void* ready_event) override {
    if (count == 0) return;
    enqueue("ncclAllReduce", [&] {
      DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready_event), 0));
      DDP_NCCL_CHECK_NONBLOCKING(
          nccl().all_reduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_));
    });
  }
  void wait_all() override { wait_stream("bucket all_reduce"); }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    if (bytes == 0) return;
    enqueue("ncclAllGather", [&] {
      DDP_NCCL_CHECK_NONBLOCKING(nccl().all_gather(in, out, bytes, ncclUint8, comm_, stream_));
    });
    wait_stream("all_gather");
  }

  void reduce_scatter_sum(const float* in, float* out,
                          const std::vector<std::size_t>& counts) override {
    const auto off = shard_offsets("reduce_scatter_sum", counts, size_);
    if (off.back() == 0) return;
    if (equal(counts)) {
      // In place (out == in + rank * count) is ncclReduceScatter's own in-place form.
      enqueue("ncclReduceScatter", [&] {
        DDP_NCCL_CHECK_NONBLOCKING(
            nccl().reduce_scatter(in, out, counts[0], ncclFloat32, ncclSum, comm_, stream_));
      });
    } else {
      // Part q reduced to rank q; a non-root's recvbuff is not used (torch passes its own
      // output there too). In place is ncclReduce's own (sendbuff == recvbuff on the root).
      enqueue("ncclReduce (reduce_scatter_sum)", [&] {
        DDP_NCCL_CHECK_NONBLOCKING(nccl().group_start());
        for (int q = 0; q < size_; ++q) {
          const auto uq = static_cast<std::size_t>(q);
          if (counts[uq] == 0) continue;
          DDP_NCCL_CHECK_NONBLOCKING(nccl().reduce(in + off[uq], out, counts[uq], ncclFloat32,
                                                   ncclSum, q, comm_, stream_));
        }
        DDP_NCCL_CHECK_NONBLOCKING(nccl().group_end());
      });
    }
    wait_stream("reduce_scatter_sum");
  }

  void all_gather_v(const float* in, float* out, const std::vector<std::size_t>& counts) override {
    const auto off = shard_offsets("all_gather_v", counts, size_);
    if (off.back() == 0) return;
    if (equal(counts)) {
      // In place (in == out + rank * count) is ncclAllGather's own in-place form.
      enqueue("ncclAllGather (all_gather_v)", [&] {
        DDP_NCCL_CHECK_NONBLOCKING(
            nccl().all_gather(in, out, counts[0], ncclFloat32, comm_, stream_));
      });
    } else {
      // Part q broadcast from rank q into its place in out; in place when in == out + off[q].
      enqueue("ncclBroadcast (all_gather_v)", [&] {
        DDP_NCCL_CHECK_NONBLOCKING(nccl().group_start());
        for (int q = 0; q < size_; ++q) {
          const auto uq = static_cast<std::size_t>(q);
          if (counts[uq] == 0) continue;
          DDP_NCCL_CHECK_NONBLOCKING(nccl().broadcast(q == rank_ ? in : out + off[uq],
                                                      out + off[uq], counts[uq], ncclFloat32, q,
                                                      comm_, stream_));
        }
        DDP_NCCL_CHECK_NONBLOCKING(nccl().group_end());
      });
    }
    wait_stream("all_gather_v");
  }

 private:
  // Runs checked calls (ddp/kernels/check.hpp) on the live communicator: a failure aborts it,
  // so the peers' waits fail in turn, and leaves as NcclError naming this rank.
  template <typename Calls>
  void live(const char* what, Calls&& calls) {
    try {
      calls();
    } catch (const Error& e) {
      fail(what, e.what());
    }
  }
  // Starts a collective (ncclInProgress is not an error: the communicator is non-blocking) and
  // polls until NCCL has taken it.
  template <typename Calls>
  void enqueue(const char* what, Calls&& calls) {
    if (aborted_) throw NcclError(std::string("nccl ") + what + ": the communicator was aborted");
    live(what, std::forward<Calls>(calls));
    wait_ready(what);
  }
  // Non-blocking calls may return ncclInProgress: poll until the call itself completes.
  void wait_ready(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      live(what, [&] { DDP_NCCL_CHECK_NONBLOCKING(nccl().comm_get_async_error(comm_, &state)); });
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, async_text(state));
      if (Clock::now() > deadline) fail(what, "timed out");
      check_interrupted(what);
      std::this_thread::yield();
    }
  }
  // Waits for the stream's work, watching for asynchronous errors (a peer gone) meanwhile.
  void wait_stream(const char* what) {
    if (aborted_) throw NcclError(std::string("nccl ") + what + ": the communicator was aborted");
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) fail(what, cudaGetErrorString(rc));
      ncclResult_t state = ncclSuccess;
      nccl().comm_get_async_error(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) fail(what, async_text(state));
      if (Clock::now() > deadline) fail(what, "timed out (a peer stopped?)");
      check_interrupted(what);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // CommOptions::interrupted, asked at most once a millisecond.
  void check_interrupted(const char* what) {
    if (!interrupted_) return;
    const auto now = Clock::now();
    if (now < next_ask_) return;
    next_ask_ = now + std::chrono::milliseconds(1);
    if (interrupted_()) fail(what, "a peer was lost (its agent said so)");
  }
  static bool equal(const std::vector<std::size_t>& counts) {
    return std::all_of(counts.begin(), counts.end(),
                       [&](std::size_t c) { return c == counts.front(); });
  }
  // An asynchronous error's text, with what to do next where check.hpp knows it.
  static std::string async_text(ncclResult_t state) {
    const auto text = kernels::detail::describe_nccl(state);
    return text.hint == nullptr ? text.error : text.error + "; " + text.hint;
  }
  [[noreturn]] void fail(const char* what, const std::string& why) {
    if (comm_ != nullptr && !aborted_) {
      nccl().comm_abort(comm_);  // frees this rank's side; the peers' waits fail in turn
      aborted_ = true;
    }
    throw NcclError(std::string("nccl ") + what + " on rank " + std::to_string(rank_) + " of " +
                    std::to_string(size_) + " failed: " + why + "; the communicator was aborted");
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  bool aborted_ = false;
  std::function<bool()> interrupted_;
  Clock::time_point next_ask_{};
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
