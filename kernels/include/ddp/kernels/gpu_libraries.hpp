// cuBLAS and NCCL, loaded on first use (CUDA builds; issue 33): the functions ddp-train calls,
// taken with dlsym from the file library_search.hpp finds. Nothing links them, so a CPU job,
// `--version` and `--help` run on machines without them, and the pip packages torch installs
// serve ddp-train too. The first call that needs a missing library throws ddp::ConfigError
// naming every place tried; each later call tries again (a library installed meanwhile loads).
#pragma once

#include <cublas_v2.h>
#include <nccl.h>

#include <string>

#include "ddp/kernels/library_search.hpp"

namespace ddp::kernels {

struct CublasApi {
  // cublasGemmEx has a C++ overload in cublas_api.h: the C function's type, spelled out.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  GemmEx gemm_ex = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasGetProperty) get_property = nullptr;
  LoadedLibrary lib;
  std::string version;  // "13.4.1"
};

struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&::ncclCommFinalize) comm_finalize = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  LoadedLibrary lib;
  std::string version;  // "2.30.7"
};

// The specs searched for (library_search.hpp): libcublas.so.13 and libnccl.so.2 for CUDA 13.
const LibrarySpec& cublas_spec();
const LibrarySpec& nccl_spec();

// Loaded once (thread-safe); ddp::ConfigError when missing, or when a function is absent.
const CublasApi& cublas();
const NcclApi& nccl();

}  // namespace ddp::kernels
