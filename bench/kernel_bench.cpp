// Achieved memory bandwidth of the memory-bound CUDA kernels against the device's own
// device-to-device copy, on one GPU: each kernel's bytes moved (reads + writes) per second, and
// the ratio to cudaMemcpy's. Prints a markdown table; --json PATH writes the figures. Without a
// GPU (or a CUDA build) it says so and exits 77. Target (issue 6): >= 80% of copy bandwidth.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/kernels/cuda_ops.hpp"
#include "ddp/kernels/device.hpp"

namespace gpu = ddp::kernels::cuda;

namespace {

void ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "kernel_bench: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

// Median-free and simple: one warm-up, then `iters` launches timed by events.
double seconds_per_call(const std::function<void()>& call, int iters) {
  call();
  cudaEvent_t a = nullptr, b = nullptr;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  ok(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) call();
  ok(cudaEventRecord(b), "cudaEventRecord");
  ok(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0.0f;
  ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) / 1e3 / iters;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: kernel_bench [--json PATH]\n");
      return 2;
    }
  }
  if (ddp::kernels::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device visible; kernel_bench did not run\n");
    return 77;
  }
  const std::size_t n = std::size_t{64} << 20;  // 64M floats, 256 MiB per buffer
  const std::size_t f = sizeof(float);
  std::vector<float*> buf(5, nullptr);
  for (auto& p : buf) {
    ok(cudaMalloc(&p, n * f), "cudaMalloc");
    ok(cudaMemset(p, 0, n * f), "cudaMemset");
  }
  std::uint16_t* half = nullptr;
  ok(cudaMalloc(&half, n * 2), "cudaMalloc");
  const int iters = 20;
  struct Row {
    std::string name;
    double bytes;
    std::function<void()> call;
  };
  const std::size_t cols = 1024;
  const std::vector<Row> rows = {
      {"cudaMemcpy device to device", 2.0 * n * f,
       [&] { ok(cudaMemcpyAsync(buf[1], buf[0], n * f, cudaMemcpyDeviceToDevice), "memcpy"); }},
      {"scale", 2.0 * n * f, [&] { gpu::scale(buf[0], n, 0.5f, nullptr); }},
      {"bias_act_forward (relu)", 2.0 * n * f,
       [&] { gpu::bias_act_forward(buf[0], buf[1], n / cols, cols, gpu::Act::relu, nullptr); }},
      {"act_backward (relu)", 3.0 * n * f,
       [&] { gpu::act_backward(buf[0], buf[1], n, gpu::Act::relu, nullptr); }},
      {"sgd_step (momentum)", 5.0 * n * f,
       [&] { gpu::sgd_step(buf[0], buf[1], buf[2], n, 0.1f, 0.9f, false, nullptr); }},
      {"adam_step", 7.0 * n * f,
       [&] {
         gpu::adam_step(buf[0], buf[1], buf[2], buf[3], n, 1e-3f, 0.9f, 0.999f, 1e-8f, 10, nullptr);
       }},
      {"f32_to_bf16", 6.0 * n, [&] { gpu::f32_to_bf16(buf[0], half, n, nullptr); }},
      {"bf16_to_f32", 6.0 * n, [&] { gpu::bf16_to_f32(half, buf[0], n, nullptr); }},
      {"mse (rows of 784)", 3.0 * n * f,
       [&] { gpu::mse(buf[0], buf[1], buf[2], buf[3], n / 784, 784, 1.0f, nullptr); }},
  };
  nlohmann::json out = nlohmann::json::array();
  double copy_bw = 0.0;
  std::printf("GPU: %s\n\n| kernel | GB/s | of copy bandwidth |\n|---|---:|---:|\n",
              ddp::kernels::cuda_device_description(0).c_str());
  for (const Row& r : rows) {
    const double s = seconds_per_call(r.call, iters);
    const double bw = r.bytes / s / 1e9;
    if (copy_bw == 0.0) copy_bw = bw;
    std::printf("| %s | %.1f | %.0f%% |\n", r.name.c_str(), bw, 100.0 * bw / copy_bw);
    out.push_back({{"kernel", r.name}, {"gbps", bw}, {"of_copy", bw / copy_bw}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  for (auto* p : buf) cudaFree(p);
  cudaFree(half);
  return 0;
}
