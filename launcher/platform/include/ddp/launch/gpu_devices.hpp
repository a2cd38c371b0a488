// The NVIDIA GPUs of this machine and the ones a worker may use: the driver's list under
// /proc/driver/nvidia/gpus (one folder per PCI bus id), filtered by CUDA_VISIBLE_DEVICES (indices,
// GPU-/MIG- UUIDs and their prefixes) the way the CUDA runtime reads it, so --nproc-per-node=gpu
// counts what torch.cuda.device_count() would. Pure functions over text, tested without GPUs.
// DDPRUN_NVIDIA_GPUS_DIR replaces the /proc folder (tests; docs/env_vars.md).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddp::launch {

// One GPU as the driver lists it; the list is in CUDA's PCI_BUS_ID order (also CUDA's default
// order when the GPUs are all of one model).
struct GpuDevice {
  std::string pci_bus_id;  // "0000:3b:00.0", lower case; empty when unknown (a MIG-<uuid> entry)
  std::string uuid;        // "GPU-8f6e...", empty when the driver did not say
};

// The machine's GPUs from a folder laid out like /proc/driver/nvidia/gpus (each subfolder a PCI
// bus id holding an `information` file with "GPU UUID:"), sorted by bus id. GPUs the driver
// marks "GPU Excluded: Yes" are left out (CUDA does not see them). Missing: empty.
std::vector<GpuDevice> machine_gpus(const std::string& root);

// The GPUs a worker may use, in the order CUDA numbers them, by torch 2.15's rules
// (torch/cuda/__init__.py, checked there against the driver): CUDA_VISIBLE_DEVICES unset: all;
// set, it is read by its first entry's kind. Indices ("1gpu2" reads as 1; spaces around an
// entry are ignored): the first invalid or negative entry ends the list, an index past the
// machine's GPUs ends it too. "GPU-" UUIDs or unique prefixes: the first entry without "GPU-",
// unknown or ambiguous ends the list. "MIG-" entries: counted as listed. A repeated entry (or
// two naming one GPU) makes the list empty, and so does an empty value. Forms never mix:
// "2,GPU-..." is [2].
std::vector<GpuDevice> visible_gpus(const std::vector<GpuDevice>& machine,
                                    const std::map<std::string, std::string>& env);

// DDPRUN_NVIDIA_GPUS_DIR from `env` when set and not empty, else /proc/driver/nvidia/gpus.
std::string nvidia_gpus_dir(const std::map<std::string, std::string>& env);
// visible_gpus(machine_gpus(nvidia_gpus_dir(env)), env).
std::vector<GpuDevice> usable_gpus(const std::map<std::string, std::string>& env);

}  // namespace ddp::launch
