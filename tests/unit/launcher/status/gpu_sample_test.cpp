// Tests of gpu_sample.hpp: NVML loaded from the stand-in library (tests/support/fake_nvml.cpp,
// named by DDPRUN_NVML_LIBRARY) gives its fixed figures; a missing library, one without the
// NVML symbols, and a failed nvmlInit_v2 leave the sampler unavailable with the step named.
#include "ddp/launch/gpu_sample.hpp"

#include <dlfcn.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>

using namespace ddp::launch;

namespace {

// Sets an environment variable for one test and restores the previous value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

constexpr unsigned long long kGiB = 1ULL << 30;

}  // namespace

TEST_CASE("gpu sample: figures from the stand-in NVML", "[unit][launch][gpu_sample]") {
  ScopedEnv lib("DDPRUN_NVML_LIBRARY", DDP_FAKE_NVML);
  // Hold the library ourselves so that its init counter outlives the sampler's dlclose.
  void* fake = ::dlopen(DDP_FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(fake);
  auto open_inits = reinterpret_cast<int (*)()>(::dlsym(fake, "fake_nvml_open_inits"));
  REQUIRE(open_inits);
  {
    GpuSampler sampler;
    REQUIRE(sampler.available());
    CHECK(sampler.why_not().empty());
    CHECK(open_inits() == 1);

    auto first = sampler.read(0);
    REQUIRE(first);
    CHECK(first->util == Approx(0.37));
    CHECK(first->mem_used == 1 * kGiB);
    CHECK(first->mem_total == 80 * kGiB);

    auto second = sampler.read(1);
    REQUIRE(second);
    CHECK(second->util == Approx(0.90));
    CHECK(second->mem_used == 40 * kGiB);
    CHECK(second->mem_total == 80 * kGiB);

    CHECK_FALSE(sampler.read(2));  // NVML_ERROR_INVALID_ARGUMENT
    CHECK_FALSE(sampler.read(-1));
    CHECK(sampler.read(0));  // still readable after a refused index
  }
  CHECK(open_inits() == 0);  // nvmlShutdown ran
  ::dlclose(fake);
}

TEST_CASE("gpu sample: a missing library is reported, not thrown", "[unit][launch][gpu_sample]") {
  const std::string path = "/nonexistent-ddp-dir/libnvidia-ml.so.1";
  ScopedEnv lib("DDPRUN_NVML_LIBRARY", path);
  GpuSampler sampler;
  CHECK_FALSE(sampler.available());
  CHECK(sampler.why_not().rfind(path + " not found: ", 0) == 0);
  CHECK(sampler.why_not().size() > path.size() + 12);  // dlerror's text follows
  CHECK_FALSE(sampler.read(0));
}

TEST_CASE("gpu sample: a library without NVML's symbols", "[unit][launch][gpu_sample]") {
  ScopedEnv lib("DDPRUN_NVML_LIBRARY", "libc.so.6");
  GpuSampler sampler;
  CHECK_FALSE(sampler.available());
  CHECK(sampler.why_not().rfind("libc.so.6 lacks nvmlInit_v2: ", 0) == 0);
  CHECK_FALSE(sampler.read(0));
}

TEST_CASE("gpu sample: a failed nvmlInit_v2 names its code and text",
          "[unit][launch][gpu_sample]") {
  ScopedEnv lib("DDPRUN_NVML_LIBRARY", DDP_FAKE_NVML);
  ScopedEnv fail("DDP_FAKE_NVML_INIT_RESULT", "9");  // NVML_ERROR_DRIVER_NOT_LOADED
  GpuSampler sampler;
  CHECK_FALSE(sampler.available());
  CHECK(sampler.why_not() == "nvmlInit_v2 returned 9: Driver Not Loaded");
  CHECK_FALSE(sampler.read(0));
}

TEST_CASE("gpu sample: the default library on this machine", "[unit][launch][gpu_sample]") {
  ScopedEnv lib("DDPRUN_NVML_LIBRARY", "");  // empty: the default name
  GpuSampler sampler;
  if (sampler.available()) {  // a machine with the NVIDIA driver
    CHECK(sampler.why_not().empty());
  } else {
    const auto& why = sampler.why_not();  // no driver library, or a driver that cannot start
    CHECK((why.rfind("libnvidia-ml.so.1 not found: ", 0) == 0 ||
           why.rfind("nvmlInit_v2 returned ", 0) == 0));
  }
}
