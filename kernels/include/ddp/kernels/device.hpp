// Device discovery shared by the GPU tests and (later) the trainer: how many CUDA devices this
// process can use. Builds without CUDA answer 0, so callers can skip GPU work visibly.
#pragma once

#include <string>

namespace ddp::kernels {

int cuda_device_count();
// Whether this build has the CUDA path (DDP_WITH_CUDA).
bool cuda_built();
// "name, compute capability X.Y, N MiB" of device `index`, for logs and perf records.
std::string cuda_device_description(int index);
// `ddp-train --gpu-libraries`: the CUDA runtime and driver, and where cuBLAS and NCCL load from
// (library_search.hpp) or why they do not; `all_found` is false when one is missing.
std::string gpu_libraries_report(bool& all_found);

}  // namespace ddp::kernels
