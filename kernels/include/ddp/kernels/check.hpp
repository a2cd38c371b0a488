// One line to check each CUDA runtime, cuBLAS or NCCL call (NCCL's checks.h): DDP_CUDA_CHECK(call),
// DDP_CUBLAS_CHECK(call) and DDP_NCCL_CHECK(call) throw ddp::CudaError or ddp::NcclError naming
// the call as written, the library's error, [file:line] and, where one helps, what to do next.
// Include <cuda_runtime.h>, <cublas_v2.h> or <nccl.h> first: each family of macros exists only
// where its library's header came before this one. A build without CUDA gets the formatting alone.
// cuBLAS and NCCL are loaded at run time (gpu_libraries.hpp): call them through cublas() and
// nccl(), whose tables also give their error strings here.
#pragma once

#include <string>

#include "ddp/proto/error.hpp"

namespace ddp::kernels::detail {

// What a failed status says: the library's text and, where one helps, the next step (or null).
struct StatusText {
  std::string error;
  const char* hint = nullptr;
};

// "<call> failed: <error>; <hint> [file:line]". Pure, so it is tested without a GPU.
inline std::string check_message(const char* call, const StatusText& text, const char* file,
                                 int line) {
  std::string m = std::string(call) + " failed: " + text.error;
  if (text.hint != nullptr && *text.hint != '\0') m += std::string("; ") + text.hint;
  return m + ::ddp::detail::where(file, line);
}

}  // namespace ddp::kernels::detail

// The shape every check shares: `call` is evaluated once; `ok(status)` decides; on a failure
// `describe(status)` (a StatusText) names it, and ErrorType is thrown with `text` (the call as
// written, for DDP_CHECK_STATUS) leading the message. The per-library macros below are this with
// their library's predicate and description.
#define DDP_CHECK_STATUS_AS(ErrorType, call, text, ok, describe)                                  \
  do {                                                                                            \
    const auto ddp_status = (call);                                                               \
    if (!(ok(ddp_status))) {                                                                      \
      throw ErrorType(                                                                            \
          ::ddp::kernels::detail::check_message(text, describe(ddp_status), __FILE__, __LINE__)); \
    }                                                                                             \
  } while (0)
#define DDP_CHECK_STATUS(ErrorType, call, ok, describe) \
  DDP_CHECK_STATUS_AS(ErrorType, call, #call, ok, describe)

#if defined(DDP_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime.h>

namespace ddp::kernels::detail {

inline bool cuda_ok(cudaError_t rc) { return rc == cudaSuccess; }

inline const char* cuda_hint(cudaError_t rc) {
  switch (rc) {
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: lower --batch-size, or run fewer processes per GPU";
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return "check CUDA_VISIBLE_DEVICES and LOCAL_RANK against nvidia-smi";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is older than this build's CUDA: update the driver";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "this build holds sm_90 code and compute_80 PTX: rebuild with "
             "CMAKE_CUDA_ARCHITECTURES set for this GPU, or update the driver";
    case cudaErrorIllegalAddress:
    case cudaErrorMisalignedAddress:
    case cudaErrorLaunchFailure:
      return "a kernel faulted and this process's CUDA context is lost: rerun under "
             "compute-sanitizer to find it";
    default: return nullptr;
  }
}

inline StatusText describe_cuda(cudaError_t rc) {
  return {std::string(cudaGetErrorString(rc)) + " (" + cudaGetErrorName(rc) + ")", cuda_hint(rc)};
}

}  // namespace ddp::kernels::detail

#define DDP_CUDA_CHECK(call)                                                \
  DDP_CHECK_STATUS(::ddp::CudaError, call, ::ddp::kernels::detail::cuda_ok, \
                   ::ddp::kernels::detail::describe_cuda)
// After a kernel launch (a string literal names the kernel): a bad launch configuration or an
// earlier asynchronous fault throws CudaError "the launch of <kernel> failed: ...".
#define DDP_CUDA_CHECK_LAUNCH(kernel)                                                \
  DDP_CHECK_STATUS_AS(::ddp::CudaError, cudaGetLastError(), "the launch of " kernel, \
                      ::ddp::kernels::detail::cuda_ok, ::ddp::kernels::detail::describe_cuda)
#endif  // DDP_WITH_CUDA || __CUDACC__

// <cublas_v2.h> came first; cuBLAS's own words come from the loaded library.
#if defined(CUBLAS_V2_H_)
#include "ddp/kernels/gpu_libraries.hpp"

namespace ddp::kernels::detail {

inline bool cublas_ok(cublasStatus_t rc) { return rc == CUBLAS_STATUS_SUCCESS; }

inline const char* cublas_hint(cublasStatus_t rc) {
  switch (rc) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLAS could not start: the GPU may be out of memory or the driver missing";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the GPU is out of memory: lower --batch-size, or run fewer processes per GPU";
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "this GPU lacks the operation (--precision bf16 needs compute capability 8.0 or "
             "newer): try --precision fp32";
    default: return nullptr;
  }
}

inline StatusText describe_cublas(cublasStatus_t rc) {
  return {::ddp::kernels::cublas().status_string(rc), cublas_hint(rc)};
}

}  // namespace ddp::kernels::detail

#define DDP_CUBLAS_CHECK(call)                                                \
  DDP_CHECK_STATUS(::ddp::CudaError, call, ::ddp::kernels::detail::cublas_ok, \
                   ::ddp::kernels::detail::describe_cublas)
#endif  // CUBLAS_V2_H_

// <nccl.h> came first; NCCL's own words come from the loaded library.
#if defined(NCCL_H_)
#include "ddp/kernels/gpu_libraries.hpp"

namespace ddp::kernels::detail {

inline bool nccl_ok(ncclResult_t rc) { return rc == ncclSuccess; }
// A non-blocking communicator's calls (ncclConfig_t::blocking = 0) may return ncclInProgress:
// the call has started, which is not an error; the caller polls ncclCommGetAsyncError.
inline bool nccl_started(ncclResult_t rc) { return rc == ncclSuccess || rc == ncclInProgress; }

inline const char* nccl_hint(ncclResult_t rc) {
  switch (rc) {
    case ncclUnhandledCudaError: return "a CUDA call inside NCCL failed: NCCL_DEBUG=WARN names it";
    case ncclSystemError:
      return "a system call failed (network, shared memory, /dev/shm's size): NCCL_DEBUG=WARN "
             "names it";
    case ncclRemoteError: return "a peer failed or went away: its own log names the cause";
    case ncclInvalidArgument:
    case ncclInvalidUsage: return "a bug in the caller: NCCL_DEBUG=WARN names the argument";
    case ncclInternalError: return "NCCL_DEBUG=INFO shows where it happened";
    default: return nullptr;
  }
}

inline StatusText describe_nccl(ncclResult_t rc) {
  return {::ddp::kernels::nccl().error_string(rc), nccl_hint(rc)};
}

}  // namespace ddp::kernels::detail

#define DDP_NCCL_CHECK(call)                                                \
  DDP_CHECK_STATUS(::ddp::NcclError, call, ::ddp::kernels::detail::nccl_ok, \
                   ::ddp::kernels::detail::describe_nccl)
// For a non-blocking communicator: ncclInProgress is not an error.
#define DDP_NCCL_CHECK_NONBLOCKING(call)                                         \
  DDP_CHECK_STATUS(::ddp::NcclError, call, ::ddp::kernels::detail::nccl_started, \
                   ::ddp::kernels::detail::describe_nccl)
#endif  // NCCL_H_
