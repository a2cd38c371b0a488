#!/usr/bin/env bash
# Side-by-side launcher benchmark of ddprun against torch 2.x's torchrun (bench/launch_bench.py):
# launch time of `--standalone --nproc-per-node=N --no-python /bin/true` and restart latency
# after a worker's SIGKILL with --max-restarts=1, the two launchers alternated in every rep.
#
# Reproduce: bash bench/run_launch_bench.sh --reps 5 [--json bench/results/launch.json]
# Arguments go to launch_bench.py (--reps N [10], --nprocs 1,2,8, --timeout S [120],
# --skip-restart, --json PATH). Environment:
#   DDPRUN          ddprun binary (default: <repo>/build/bin/ddprun; not built here)
#   DDP_TORCH_VENV  venv with torch 2.x and torchrun (default: ~/.cache/ddprun/torch-venv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Run in a network namespace with only loopback: neither launcher's name lookups can leave the
# machine, and both see the same quiet network.
if [[ -z "${DDP_IN_LOOPBACK_NS:-}" ]]; then
  DDP_IN_LOOPBACK_NS=1 exec scripts/loopback_only.sh bash bench/run_launch_bench.sh "$@"
fi

DDPRUN=${DDPRUN:-$PWD/build/bin/ddprun}
DDP_TORCH_VENV=${DDP_TORCH_VENV:-$HOME/.cache/ddprun/torch-venv}
export DDP_TORCH_VENV
if [[ ! -x $DDPRUN ]]; then
  echo "run_launch_bench: $DDPRUN not found; build it first (ninja -C build ddprun)" >&2
  exit 2
fi
if [[ ! -x $DDP_TORCH_VENV/bin/python || ! -x $DDP_TORCH_VENV/bin/torchrun ]]; then
  echo "run_launch_bench: no torch venv at $DDP_TORCH_VENV (scripts/setup.sh --with-torch)" >&2
  exit 2
fi
exec "$DDP_TORCH_VENV/bin/python" bench/launch_bench.py --ddprun "$DDPRUN" \
  --torchrun "$DDP_TORCH_VENV/bin/torchrun" "$@"
