// NVML through dlopen (gpu_sample.hpp). STUB: owned by a helper.
#include "ddp/launch/gpu_sample.hpp"

namespace ddp::launch {

struct GpuSampler::Impl {
  std::string why = "stub";
};
GpuSampler::GpuSampler() : impl_(std::make_unique<Impl>()) {}
GpuSampler::~GpuSampler() = default;
bool GpuSampler::available() const { return false; }
const std::string& GpuSampler::why_not() const { return impl_->why; }
std::optional<GpuReading> GpuSampler::read(int) { return std::nullopt; }

}  // namespace ddp::launch
