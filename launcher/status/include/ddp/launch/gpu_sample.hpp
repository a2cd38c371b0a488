// GPU use and memory per device from NVML, loaded at run time with dlopen (libnvidia-ml.so.1,
// or DDPRUN_NVML_LIBRARY): ddprun neither links nor needs the driver, so machines without a GPU
// run the same binary and simply report no GPU figures.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace ddp::launch {

struct GpuReading {
  double util = 0;  // 0..1: the share of the last sample period a kernel ran
  std::uint64_t mem_used = 0;
  std::uint64_t mem_total = 0;
};

class GpuSampler {
 public:
  GpuSampler();  // loads NVML and initializes it; never throws
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;
  bool available() const;
  // Why NVML is not available ("" when it is): "<lib> not found: <dlerror>", "<lib> lacks
  // <symbol>: <dlerror>" or "nvmlInit_v2 returned <code>: <nvmlErrorString>".
  const std::string& why_not() const;
  // Device `index` as NVML numbers it (the physical index); nullopt when unavailable, or when
  // NVML refuses the index, its utilization or its memory (e.g. a MIG instance's utilization).
  std::optional<GpuReading> read(int index);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::launch
