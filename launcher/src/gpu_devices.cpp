// See gpu_devices.hpp.
#include "ddp/launch/gpu_devices.hpp"

namespace ddp::launch {

std::vector<GpuDevice> machine_gpus(const std::string& root) {
  (void)root;
  return {};
}

std::vector<GpuDevice> visible_gpus(const std::vector<GpuDevice>& machine,
                                    const std::map<std::string, std::string>& env) {
  (void)env;
  return machine;
}

}  // namespace ddp::launch
