// GPU presence checks; kernel tests against their CPU references join this file in issue 6.
#include <catch2/catch.hpp>

#include "ddp/kernels/device.hpp"

TEST_CASE("a visible CUDA device reports a description", "[gpu]") {
  REQUIRE(ddp::kernels::cuda_device_count() > 0);
  CHECK(ddp::kernels::cuda_device_description(0).find("compute capability") != std::string::npos);
}
