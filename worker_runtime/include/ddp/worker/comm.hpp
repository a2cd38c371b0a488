// The communicator: the collectives a data-parallel worker needs (all-reduce, broadcast,
// barrier, all-gather), bootstrapped through the job's store. Backends: Gloo over TCP (CPU
// memory) and NCCL (device memory, CUDA builds). Calls are collective: every rank makes the same
// calls in the same order. A failure (a peer gone, a timeout) throws ddp::IoError (gloo, shm) or
// ddp::NcclError (nccl) naming the collective; the communicator is then unusable and the worker
// should exit.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace ddp::rdzv {
class StoreClient;
}

namespace ddp::worker {

struct WorkerEnv;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  // In place: data[i] = sum over ranks of data[i]. Pointers are in the backend's memory space
  // (host for gloo, device for nccl).
  virtual void all_reduce_sum(float* data, std::size_t count) = 0;
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // out holds size() * bytes; rank r's `in` lands at out + r * bytes.
  virtual void all_gather(const void* in, void* out, std::size_t bytes) = 0;
};

// Stream-ordered all-reduce, which the NCCL communicator also offers: a bucket's all-reduce is
// enqueued on the communicator's stream behind an event of the caller's compute stream (no host
// synchronisation), and wait_all() completes every enqueued one, aborting on a failure.
class StreamAllReduce {
 public:
  virtual ~StreamAllReduce() = default;
  // ready_event: a cudaEvent_t recorded after the data were written.
  virtual void all_reduce_sum_after(float* device_data, std::size_t count, void* ready_event) = 0;
  virtual void wait_all() = 0;  // throws ddp::NcclError naming the failure (peer gone, timeout)
};

struct CommOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<rdzv::StoreClient> store;  // the job's store (shared with the caller)
  std::string key_prefix;                    // e.g. WorkerEnv::store_prefix() + "/gloo"
  // Address peers reach this rank on. Empty: the local address of the route towards
  // `route_towards` (MASTER_ADDR), so a loopback job stays on loopback and a cluster job uses the
  // interface that reaches the master. GLOO_SOCKET_IFNAME, as in torch, names an interface.
  std::string local_address;
  std::string route_towards = "127.0.0.1";
  std::string iface;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};  // torch's default pg timeout
};

// Gloo over TCP: ranks publish their addresses under key_prefix and connect a full mesh.
std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& options);
// For ranks that share one host: all-reduce through a shared-memory segment (created by rank 0,
// named in the store under key_prefix, unlinked once every rank has mapped it); the other
// collectives stay with `base`. Collective. Returns `base` itself when any rank cannot map the
// segment (a note on stderr).
std::unique_ptr<Communicator> make_local_communicator(std::unique_ptr<Communicator> base,
                                                      const CommOptions& options);
// NCCL: rank 0 publishes the ncclUniqueId under key_prefix, the others wait for it. Throws
// ddp::ConfigError in a build without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options, int device);

// The local address the kernel would use to reach `host` (no packet is sent).
std::string local_address_towards(const std::string& host);

// The job's store as a worker sees it: the agent's (TORCHELASTIC_USE_AGENT_STORE=True), or one
// that rank 0 hosts on MASTER_ADDR:MASTER_PORT when the worker runs without an agent, as
// torch's env:// rendezvous does.
class WorkerStore {
 public:
  explicit WorkerStore(const WorkerEnv& env);
  ~WorkerStore();
  WorkerStore(const WorkerStore&) = delete;
  WorkerStore& operator=(const WorkerStore&) = delete;
  const std::shared_ptr<rdzv::StoreClient>& client() const { return client_; }

 private:
  struct Hosted;
  std::unique_ptr<Hosted> hosted_;
  std::shared_ptr<rdzv::StoreClient> client_;
};

}  // namespace ddp::worker
