// main() of the GPU tests: without a CUDA device it says so and exits 77, which ctest reports
// as "Skipped" (never as passed); with one it runs the Catch2 suite (Catch2's implementation
// is tests/support/catch_impl.cpp).
#include <cstdio>

#include "ddp/kernels/device.hpp"
#include "support/catch_run.hpp"
#include "support/skip.hpp"

int main(int argc, char** argv) {
  int n = ddp::kernels::cuda_device_count();
  if (n == 0) {
    ddp::test::note_suite_skip("no CUDA device visible to this process: the GPU tests did not run");
    return 77;
  }
  for (int i = 0; i < n; ++i) {
    std::printf("GPU %d: %s\n", i, ddp::kernels::cuda_device_description(i).c_str());
  }
  return ddp_catch_run(argc, argv);
}
