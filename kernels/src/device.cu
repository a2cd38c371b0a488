// CUDA build of device discovery: cudaGetDeviceCount, treating "no driver" and "no device"
// as zero devices rather than as errors.
#include <cuda_runtime.h>

#include "ddp/kernels/device.hpp"

namespace ddp::kernels {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "unknown device";
  return std::string(p.name) + ", compute capability " + std::to_string(p.major) + "." +
         std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB";
}

bool cuda_built() { return true; }

}  // namespace ddp::kernels
