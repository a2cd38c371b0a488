# Every third-party package comes from Debian's archive (scripts/setup.sh installs them):
# Boost (Asio, Process), nlohmann/json, spdlog, CLI11, Catch2 v2; CUDA and NCCL when enabled
# (NCCL's header only: NCCL and cuBLAS are loaded at run time, kernels/gpu_libraries.hpp).
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS filesystem)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto SSL)  # HMAC-SHA256 of store authentication; TLS to etcd
if(DDP_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
if(DDP_WITH_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
endif()
# The worker runtime and ddp-train: Gloo (CPU collectives), OpenBLAS (matrix products), zlib
# (gzipped IDX files). Debian: libgloo-dev, libopenblas-dev, zlib1g-dev.
find_package(Gloo REQUIRED)
find_package(ZLIB REQUIRED)
find_library(OPENBLAS_LIBRARY NAMES openblas REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h
          HINTS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas
          NO_DEFAULT_PATH REQUIRED)
