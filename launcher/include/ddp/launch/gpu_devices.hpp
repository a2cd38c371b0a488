// The NVIDIA GPUs of this machine and the ones a worker may use: the driver's list under
// /proc/driver/nvidia/gpus (one folder per PCI bus id), filtered by CUDA_VISIBLE_DEVICES (indices,
// GPU-/MIG- UUIDs and their prefixes) the way the CUDA runtime reads it, so --nproc-per-node=gpu
// counts what torch.cuda.device_count() would. Pure functions over text, tested without GPUs.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddp::launch {

// One GPU as the driver lists it; the list is in CUDA's PCI_BUS_ID order.
struct GpuDevice {
  std::string pci_bus_id;  // "0000:3b:00.0", lower case
  std::string uuid;        // "GPU-8f6e...", empty when the driver did not say
};

// The machine's GPUs from a folder laid out like /proc/driver/nvidia/gpus (each subfolder a PCI
// bus id holding an `information` file with "GPU UUID:"), sorted by bus id. Missing: empty.
std::vector<GpuDevice> machine_gpus(const std::string& root);

// The GPUs a worker may use, in the order CUDA numbers them.
std::vector<GpuDevice> visible_gpus(const std::vector<GpuDevice>& machine,
                                    const std::map<std::string, std::string>& env);

}  // namespace ddp::launch
