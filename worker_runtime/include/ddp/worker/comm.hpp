// The communicator: the collectives a data-parallel worker needs (all-reduce, broadcast,
// barrier, all-gather, and for sharded training reduce-scatter and all-gather with per-rank
// counts), bootstrapped through the job's store. Backends: Gloo over TCP (CPU memory), shared
// memory in front of it, and NCCL (device memory, CUDA builds). Calls are collective: every
// rank makes the same calls in the same order. A failure (a peer gone, a timeout) throws
// ddp::IoError (gloo, shm) or ddp::NcclError (nccl) naming the collective; the communicator is
// then unusable and the worker should exit.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"

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

  // Sharded collectives (FSDP / ZeRO). counts[q] is the number of floats of rank q's part;
  // counts must be the same on every rank and have size() entries (else ddp::ConfigError naming
  // the collective), and a part may be empty. Part q starts at offset(q) = counts[0] + ... +
  // counts[q-1] of the whole (shard_offsets). Pointers are in the backend's memory space.
  //
  // reduce_scatter_sum: `in` holds the whole, sum(counts) floats; rank r receives in `out`
  // (counts[r] floats) the elementwise sum over ranks of their part r. In place is allowed:
  // out == in + offset(r). Gloo and shm add in rank order, ((rank 0 + rank 1) + rank 2) + ...,
  // the order of the shm all-reduce, so there reduce_scatter_sum then all_gather_v gives the
  // bits all_reduce_sum gives; NCCL adds in its own order.
  virtual void reduce_scatter_sum(const float* in, float* out,
                                  const std::vector<std::size_t>& counts) = 0;
  // all_gather_v: rank r contributes `in` (counts[r] floats); every rank receives in `out` the
  // whole, sum(counts) floats, the parts in rank order. In place is allowed:
  // in == out + offset(r).
  virtual void all_gather_v(const float* in, float* out,
                            const std::vector<std::size_t>& counts) = 0;

  // Point to point, collective in form (every rank calls it, in order with the others): this
  // rank sends send_bytes from `send` to rank `to` and receives recv_bytes into `recv` from rank
  // `from`; -1 (or 0 bytes) for none. The sizes must match the peers' (a receive of 0 bytes
  // when the sender sends none). In-place recovery's shard copies use it. Host memory; the
  // default (a backend without it) throws ddp::ConfigError.
  virtual void exchange(const void* send, std::size_t send_bytes, int to, void* recv,
                        std::size_t recv_bytes, int from) {
    (void)send, (void)send_bytes, (void)to, (void)recv, (void)recv_bytes, (void)from;
    throw ConfigError(std::string("exchange: the ") + backend() +
                      " communicator has no point-to-point transfer");
  }
};

// counts for `total` elements cut into `world` parts, as even as can be: the first
// total % world ranks get one more. Throws ddp::ConfigError when world < 1.
inline std::vector<std::size_t> even_shards(std::size_t total, int world) {
  if (world < 1) {
    throw ConfigError("even_shards: world size " + std::to_string(world) + " is not positive");
  }
  const auto w = static_cast<std::size_t>(world);
  std::vector<std::size_t> counts(w, total / w);
  for (std::size_t q = 0; q < total % w; ++q) ++counts[q];
  return counts;
}

// The parts' offsets, size() + 1 entries (the last is the whole's size), after checking that
// counts has one entry per rank: a ddp::ConfigError names `what` otherwise.
inline std::vector<std::size_t> shard_offsets(const char* what,
                                              const std::vector<std::size_t>& counts, int size) {
  if (counts.size() != static_cast<std::size_t>(size)) {
    throw ConfigError(std::string(what) + ": counts has " + std::to_string(counts.size()) +
                      " entries for a world of " + std::to_string(size) +
                      " ranks (one per rank expected)");
  }
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) offsets[q + 1] = offsets[q] + counts[q];
  return offsets;
}

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
  // NCCL: asked about once a millisecond while a collective waits; true aborts the communicator
  // and throws ddp::NcclError (in-place recovery: the agent said a peer is lost, a death NCCL
  // does not see between the GPUs of one node). Empty: never.
  std::function<bool()> interrupted;
};

// Gloo over TCP: ranks publish their addresses under key_prefix and connect a full mesh.
std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& options);
// For ranks that share one host: all-reduce, reduce-scatter and all_gather_v through a
// shared-memory segment (created by rank 0, named in the store under key_prefix, unlinked once
// every rank has mapped it); broadcast, barrier and the byte all-gather stay with `base`.
// Collective. Returns `base` itself when any rank cannot map the segment (a note on stderr).
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
