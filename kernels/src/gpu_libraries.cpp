// cuBLAS and NCCL loaded at run time (gpu_libraries.hpp): each function taken by its exported
// name, the library's version read once, a missing function named with the version found.
#include "ddp/kernels/gpu_libraries.hpp"

#include <dlfcn.h>

#include <cuda_runtime.h>

#include "ddp/kernels/device.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::kernels {

namespace {

constexpr int kCudaMajor = CUDART_VERSION / 1000;
const std::string kCuFolder = "cu" + std::to_string(kCudaMajor);

template <typename F>
void take(F& fn, const LoadedLibrary& lib, const char* name, const std::string& what,
          const std::string& version, const char* needs) {
  ::dlerror();
  void* p = ::dlsym(lib.handle, name);
  if (p == nullptr) {
    throw ConfigError(lib.path + " (" + what + (version.empty() ? "" : " " + version) + ") lacks " +
                      name + ": ddp-train needs " + needs);
  }
  fn = reinterpret_cast<F>(p);
}

CublasApi load_cublas() {
  CublasApi a;
  a.lib = load_library(cublas_spec(), search_places(cublas_spec()));
  const auto& w = cublas_spec().what;
  const char* needs = "cuBLAS 13";
  take(a.get_property, a.lib, "cublasGetProperty", w, "", needs);
  int major = 0, minor = 0, patch = 0;
  a.get_property(MAJOR_VERSION, &major);
  a.get_property(MINOR_VERSION, &minor);
  a.get_property(PATCH_LEVEL, &patch);
  a.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  take(a.create, a.lib, "cublasCreate_v2", w, a.version, needs);
  take(a.destroy, a.lib, "cublasDestroy_v2", w, a.version, needs);
  take(a.set_stream, a.lib, "cublasSetStream_v2", w, a.version, needs);
  take(a.sgemm, a.lib, "cublasSgemm_v2", w, a.version, needs);
  take(a.gemm_ex, a.lib, "cublasGemmEx", w, a.version, needs);
  take(a.status_string, a.lib, "cublasGetStatusString", w, a.version, needs);
  return a;
}

NcclApi load_nccl() {
  NcclApi a;
  a.lib = load_library(nccl_spec(), search_places(nccl_spec()));
  const auto& w = nccl_spec().what;
  const char* needs = "NCCL 2.14 or newer (non-blocking communicators)";
  take(a.get_version, a.lib, "ncclGetVersion", w, "", needs);
  int code = 0;
  a.get_version(&code);
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  a.version = std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
              std::to_string(code % 100);
  take(a.error_string, a.lib, "ncclGetErrorString", w, a.version, needs);
  take(a.get_unique_id, a.lib, "ncclGetUniqueId", w, a.version, needs);
  take(a.comm_init_rank_config, a.lib, "ncclCommInitRankConfig", w, a.version, needs);
  take(a.comm_finalize, a.lib, "ncclCommFinalize", w, a.version, needs);
  take(a.comm_destroy, a.lib, "ncclCommDestroy", w, a.version, needs);
  take(a.comm_abort, a.lib, "ncclCommAbort", w, a.version, needs);
  take(a.comm_get_async_error, a.lib, "ncclCommGetAsyncError", w, a.version, needs);
  take(a.all_reduce, a.lib, "ncclAllReduce", w, a.version, needs);
  take(a.broadcast, a.lib, "ncclBroadcast", w, a.version, needs);
  take(a.all_gather, a.lib, "ncclAllGather", w, a.version, needs);
  take(a.reduce_scatter, a.lib, "ncclReduceScatter", w, a.version, needs);
  take(a.reduce, a.lib, "ncclReduce", w, a.version, needs);
  take(a.group_start, a.lib, "ncclGroupStart", w, a.version, needs);
  take(a.group_end, a.lib, "ncclGroupEnd", w, a.version, needs);
  return a;
}

}  // namespace

const LibrarySpec& cublas_spec() {
  static const LibrarySpec s{
      "cuBLAS",
      "libcublas.so." + std::to_string(kCudaMajor),
      {"cublas", kCuFolder},
      "DDPRUN_CUBLAS_LIBRARY",
      "install it into this Python environment with `pip install nvidia-cublas` (the package "
      "torch's CUDA wheels bring), or CUDA " +
          std::to_string(kCudaMajor) + "'s libcublas from NVIDIA's apt repository"};
  return s;
}

const LibrarySpec& nccl_spec() {
  static const LibrarySpec s{
      "NCCL",
      "libnccl.so.2",
      {"nccl", kCuFolder},
      "DDPRUN_NCCL_LIBRARY",
      "install it into this Python environment with `pip install nvidia-nccl-cu" +
          std::to_string(kCudaMajor) +
          "` (the package torch's CUDA wheels bring), or libnccl2 from NVIDIA's apt repository"};
  return s;
}

std::string gpu_libraries_report(bool& all_found) {
  all_found = true;
  std::string r = "CUDA runtime " + std::to_string(kCudaMajor) + "." +
                  std::to_string(CUDART_VERSION % 1000 / 10) + " (static, in this program)\n";
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    r += "CUDA driver " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) +
         " (libcuda.so.1)\n";
  } else {
    r += "CUDA driver: none (no libcuda.so.1: no NVIDIA driver here; --device cpu still runs)\n";
  }
  try {
    const auto& b = cublas();
    r += "cuBLAS " + b.version + ": " + b.lib.path + " (" + b.lib.from + ")\n";
  } catch (const Error& e) {
    all_found = false;
    r += std::string("cuBLAS: missing: ") + e.what() + "\n";
  }
  try {
    const auto& n = nccl();
    r += "NCCL " + n.version + ": " + n.lib.path + " (" + n.lib.from + ")\n";
  } catch (const Error& e) {
    all_found = false;
    r += std::string("NCCL: missing: ") + e.what() + "\n";
  }
  return r;
}

// A static whose initializer throws is initialized again by the next call (C++ [stmt.dcl]).
const CublasApi& cublas() {
  static const CublasApi api = load_cublas();
  return api;
}

const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  return api;
}

}  // namespace ddp::kernels
