// A stand-in for libnvidia-ml.so.1 with the entry points gpu_sample.cpp loads: two devices with
// fixed figures (0: 37% busy, 1 GiB used of 80 GiB; 1: 90% busy, 40 GiB used of 80 GiB).
// DDP_FAKE_NVML_INIT_RESULT=N makes nvmlInit_v2 return N (tests of a failed init).
#include <cstdlib>

namespace {

constexpr int kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2;
constexpr unsigned long long kGiB = 1ULL << 30;

struct Device {
  unsigned int util_gpu;
  unsigned long long used;
};
const Device kDevices[] = {{37, 1 * kGiB}, {90, 40 * kGiB}};
constexpr unsigned int kDeviceCount = sizeof(kDevices) / sizeof(kDevices[0]);

int g_inits = 0;  // nvmlInit_v2 calls not yet matched by nvmlShutdown (NVML counts them too)

}  // namespace

// The ABI of nvml.h (gpu_sample.cpp declares the same shapes).
struct nvmlDevice_st;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

extern "C" {

int nvmlInit_v2() {
  if (const char* forced = std::getenv("DDP_FAKE_NVML_INIT_RESULT")) {
    const int rc = std::atoi(forced);
    if (rc != kSuccess) return rc;
  }
  ++g_inits;
  return kSuccess;
}

int nvmlShutdown() {
  if (g_inits == 0) return kUninitialized;
  --g_inits;
  return kSuccess;
}

const char* nvmlErrorString(int rc) {
  switch (rc) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_st** device) {
  if (g_inits == 0) return kUninitialized;
  if (index >= kDeviceCount || !device) return kInvalidArgument;
  // The handle is opaque to callers: here, a pointer into kDevices.
  *device = reinterpret_cast<nvmlDevice_st*>(const_cast<Device*>(&kDevices[index]));
  return kSuccess;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_st* device, nvmlUtilization_t* util) {
  if (g_inits == 0) return kUninitialized;
  if (!device || !util) return kInvalidArgument;
  const auto* d = reinterpret_cast<const Device*>(device);
  util->gpu = d->util_gpu;
  util->memory = d->util_gpu / 2;
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_st* device, nvmlMemory_t* mem) {
  if (g_inits == 0) return kUninitialized;
  if (!device || !mem) return kInvalidArgument;
  const auto* d = reinterpret_cast<const Device*>(device);
  mem->total = 80 * kGiB;
  mem->used = d->used;
  mem->free = mem->total - d->used;
  return kSuccess;
}

// Tests only: how many inits are outstanding (0 after the sampler is destroyed).
int fake_nvml_open_inits() { return g_inits; }

}  // extern "C"
