// NVML through dlopen (gpu_sample.hpp). The few NVML types are declared here with the ABI that
// nvml.h documents, so building needs no NVML header; a missing library, symbol or a failed
// nvmlInit_v2 leaves the sampler unavailable with the failed step in why_not().
#include "ddp/launch/gpu_sample.hpp"

#include <dlfcn.h>

#include "ddp/proto/knobs.hpp"

namespace ddp::launch {
namespace {

// nvml.h: `typedef enum nvmlReturn_enum {NVML_SUCCESS = 0, ...} nvmlReturn_t;`,
// `typedef struct nvmlDevice_st* nvmlDevice_t;` and the two structs below, field for field.
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the last sample period a kernel ran
  unsigned int memory;  // percent of it device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
};

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using HandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using UtilFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using MemoryFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using ErrorStringFn = const char* (*)(nvmlReturn_t);

constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

std::string dl_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown dlerror";
}

}  // namespace

struct GpuSampler::Impl {
  void* lib = nullptr;
  bool initialized = false;
  std::string why;
  InitFn init = nullptr;
  ShutdownFn shutdown = nullptr;
  HandleFn handle_by_index = nullptr;
  UtilFn utilization = nullptr;
  MemoryFn memory = nullptr;
  ErrorStringFn error_string = nullptr;

  // Resolves `name` into `fn`; false (and `why` set) when the library lacks it.
  template <class Fn>
  bool resolve(Fn& fn, const char* name, const std::string& library) {
    ::dlerror();
    void* sym = ::dlsym(lib, name);
    if (!sym) {
      why = library + " lacks " + name + ": " + dl_error();
      return false;
    }
    fn = reinterpret_cast<Fn>(sym);
    return true;
  }

  void load() {
    const std::string library = knobs::text("DDPRUN_NVML_LIBRARY").value_or("");
    const std::string name = library.empty() ? kDefaultLibrary : library;
    lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      why = name + " not found: " + dl_error();
      return;
    }
    if (!resolve(init, "nvmlInit_v2", name) || !resolve(shutdown, "nvmlShutdown", name) ||
        !resolve(handle_by_index, "nvmlDeviceGetHandleByIndex_v2", name) ||
        !resolve(utilization, "nvmlDeviceGetUtilizationRates", name) ||
        !resolve(memory, "nvmlDeviceGetMemoryInfo", name) ||
        !resolve(error_string, "nvmlErrorString", name)) {
      return;
    }
    if (const nvmlReturn_t rc = init(); rc != kNvmlSuccess) {
      const char* text = error_string(rc);
      why = "nvmlInit_v2 returned " + std::to_string(rc) + ": " + (text ? text : "?");
      return;
    }
    initialized = true;
  }

  ~Impl() {
    if (initialized) shutdown();
    if (lib) ::dlclose(lib);
  }
};

GpuSampler::GpuSampler() : impl_(std::make_unique<Impl>()) { impl_->load(); }
GpuSampler::~GpuSampler() = default;

bool GpuSampler::available() const { return impl_->initialized; }

const std::string& GpuSampler::why_not() const { return impl_->why; }

std::optional<GpuReading> GpuSampler::read(int index) {
  if (!impl_->initialized || index < 0) return std::nullopt;
  nvmlDevice_t device = nullptr;
  if (impl_->handle_by_index(static_cast<unsigned int>(index), &device) != kNvmlSuccess) {
    return std::nullopt;
  }
  nvmlUtilization_t util{};
  nvmlMemory_t mem{};
  if (impl_->utilization(device, &util) != kNvmlSuccess ||
      impl_->memory(device, &mem) != kNvmlSuccess) {
    return std::nullopt;  // e.g. NVML_ERROR_NOT_SUPPORTED (a MIG instance's utilization)
  }
  GpuReading r;
  r.util = static_cast<double>(util.gpu) / 100.0;
  r.mem_used = mem.used;
  r.mem_total = mem.total;
  return r;
}

}  // namespace ddp::launch
