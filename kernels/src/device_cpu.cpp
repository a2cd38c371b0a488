// CPU-only build of device discovery: there is never a CUDA device.
#include "ddp/kernels/device.hpp"

namespace ddp::kernels {

int cuda_device_count() { return 0; }
std::string cuda_device_description(int) { return "no CUDA support in this build"; }

bool cuda_built() { return false; }

std::string gpu_libraries_report(bool& all_found) {
  all_found = true;
  return "a CPU build (without CUDA): it loads no GPU library\n";
}

}  // namespace ddp::kernels
