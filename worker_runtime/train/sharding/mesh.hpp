// The 2-D device mesh of ddp-train (--mesh dp=D,tp=T, issue 20): which data-parallel row and
// tensor-parallel column every rank takes, placed so that a tensor-parallel group stays on one
// node (its all-reduces run every layer; the data-parallel ones once a step), and the
// sub-communicators of the rows and columns, built from the job's store like the world's.
// parse_mesh and place_mesh are pure; make_mesh_comms connects.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/worker/comm.hpp"

namespace ddp::train {

struct MeshShape {
  int dp = 1;
  int tp = 1;
};
inline constexpr int kMaxMeshDim = 4096;

// "dp=D,tp=T" (either order), "tp=T" or "dp=D" (the other is world / given), "" (dp = world,
// tp = 1). Throws ConfigError naming --mesh: an unknown key, a repeated key, a value that is not
// a positive integer or past kMaxMeshDim, or D * T != world.
MeshShape parse_mesh(std::string_view text, int world);

struct MeshPlace {
  MeshShape shape;
  std::vector<int> dp;  // rank r's data-parallel index (its row)
  std::vector<int> tp;  // rank r's tensor-parallel index (its column)
  // Ranks of tp group i (row i: dp index i) in tp order, and of dp group j (column j) in dp order.
  std::vector<std::vector<int>> tp_groups;
  std::vector<std::vector<int>> dp_groups;
  bool tp_crosses_nodes = false;  // some tp group has ranks on two hosts
  // One line for the log: "mesh dp=2 x tp=2: tp groups [0 1] on node-a, [2 3] on node-b" (or
  // "... spans node-a,node-b" for a group that crosses nodes).
  std::string describe(const std::vector<std::string>& hosts) const;
};

// hosts[r]: rank r's host. Ranks are ordered host by host (hosts in the order of their lowest
// rank; within a host by rank) and the k-th rank in that order takes dp = k / T, tp = k % T, so
// tensor-parallel groups stay within a host whenever each host holds a multiple of T ranks
// (with ddprun's node-contiguous ranks this is rank r -> (r / T, r % T)). Throws ConfigError when
// hosts.size() != D * T.
MeshPlace place_mesh(const std::vector<std::string>& hosts, MeshShape shape);

// This rank's communicators over its tp group and its dp group (null for a group of one).
struct MeshComms {
  MeshPlace place;
  std::vector<std::string> hosts;
  std::unique_ptr<worker::Communicator> tp;
  std::unique_ptr<worker::Communicator> dp;
  int tp_rank = 0;
  int dp_rank = 0;
};

enum class MeshBackend { gloo, nccl };
// Collective over the world: gathers every rank's host name through `world` (null: one rank),
// places the mesh, then connects each group as the world's communicator is connected
// (`base`'s store, address and timeout; key prefixes base.key_prefix + "/tp<i>" and "/dp<j>"):
// Gloo, with shared memory in front when every member of the group is on this host and `shm`,
// or NCCL on `cuda_device`.
MeshComms make_mesh_comms(worker::Communicator* world, const worker::CommOptions& base,
                          MeshShape shape, MeshBackend backend, bool shm, int cuda_device);

// A communicator that counts what passes through it (the payload each call hands the
// collective, per rank, in bytes) and forwards to `inner`: the measured side of the
// communication-volume table (docs/perf.md).
class CountingCommunicator final : public worker::Communicator {
 public:
  explicit CountingCommunicator(std::unique_ptr<worker::Communicator> inner);
  int rank() const override;
  int size() const override;
  const char* backend() const override;
  void all_reduce_sum(float* data, std::size_t count) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  void all_gather(const void* in, void* out, std::size_t bytes) override;
  void reduce_scatter_sum(const float* in, float* out,
                          const std::vector<std::size_t>& counts) override;
  void all_gather_v(const float* in, float* out, const std::vector<std::size_t>& counts) override;

  // all_reduce: 4 count; reduce_scatter and all_gather_v: 4 sum(counts) (the whole);
  // all_gather: size() * bytes; broadcast: bytes; calls: one per collective.
  struct Counts {
    std::size_t all_reduce_bytes = 0;
    std::size_t reduce_scatter_bytes = 0;
    std::size_t all_gather_bytes = 0;
    std::size_t other_bytes = 0;
    std::size_t calls = 0;
    std::size_t total() const {
      return all_reduce_bytes + reduce_scatter_bytes + all_gather_bytes + other_bytes;
    }
  };
  const Counts& counts() const { return counts_; }
  void reset() { counts_ = Counts{}; }

 private:
  std::unique_ptr<worker::Communicator> inner_;
  Counts counts_;
};

}  // namespace ddp::train
