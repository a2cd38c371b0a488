// Which GPU a worker uses: LOCAL_RANK's device among those CUDA_VISIBLE_DEVICES shows, or the
// only visible one when the scheduler gives each task its own GPU (Slurm's --gpus-per-task=1,
// where every task sees one device 0). Pure, so the rule is tested without a GPU.
#pragma once

#include <string>

namespace ddp::worker {

// Throws ddp::ConfigError naming LOCAL_RANK, the visible count and CUDA_VISIBLE_DEVICES when no
// device fits (none visible, or LOCAL_RANK past the visible ones).
int pick_cuda_device(int local_rank, int visible_count, const std::string& cuda_visible_devices);

}  // namespace ddp::worker
