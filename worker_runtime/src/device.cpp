// The GPU of a worker (see device.hpp).
#include "ddp/worker/device.hpp"

#include "ddp/proto/error.hpp"

namespace ddp::worker {

int pick_cuda_device(int local_rank, int visible_count, const std::string& cuda_visible_devices) {
  const std::string shown = cuda_visible_devices.empty()
                                ? std::string("CUDA_VISIBLE_DEVICES unset")
                                : "CUDA_VISIBLE_DEVICES=" + cuda_visible_devices;
  if (visible_count <= 0) {
    throw ConfigError("no CUDA device is visible to this worker (" + shown + "); use --device cpu");
  }
  if (visible_count == 1) return 0;  // one GPU per task: it is ours whatever LOCAL_RANK is
  if (local_rank < visible_count) return local_rank;
  throw ConfigError("LOCAL_RANK=" + std::to_string(local_rank) +
                    " has no GPU: " + std::to_string(visible_count) + " are visible (" + shown +
                    "); start at most that many workers per node (--nproc-per-node=gpu)");
}

}  // namespace ddp::worker
