#!/usr/bin/env bash
# Side-by-side rendezvous benchmark: ddprun's rendezvous (bench/rdzv_bench.cpp, agents as
# threads) against torch 2.x's c10d dynamic rendezvous (bench/torch_rdzv_bench.py, agents as
# processes, as torchrun's are), both against a ddprund for the N a 2-core machine can run as
# Python processes; then ddprun alone for N up to 4096 (in-process server, which also counts
# store requests per agent) and the dead-node detection latency of the lease will.
#
# Reproduce: bash bench/run_rdzv_bench.sh
# Environment: BUILD_DIR [build], DDP_TORCH_VENV [~/.cache/ddprun/torch-venv],
#   SMALL_N [2,4,8], LARGE_N [2,8,64,256,1024,4096], REPS [3], LEASE_MS [1000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${DDP_IN_LOOPBACK_NS:-}" ]]; then
  DDP_IN_LOOPBACK_NS=1 exec scripts/loopback_only.sh bash bench/run_rdzv_bench.sh "$@"
fi
BUILD_DIR=${BUILD_DIR:-build}
venv=${DDP_TORCH_VENV:-$HOME/.cache/ddprun/torch-venv}
SMALL_N=${SMALL_N:-2,4,8}
LARGE_N=${LARGE_N:-2,8,64,256,1024,4096}
REPS=${REPS:-3}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
for b in rdzv_bench ddprund; do
  [[ -x $BUILD_DIR/bin/$b ]] || { echo "run_rdzv_bench: build $b first (ninja -C $BUILD_DIR $b)" >&2; exit 2; }
done

dir=$(mktemp -d)
"$BUILD_DIR/bin/ddprund" --host 127.0.0.1 --port 0 --port-file "$dir/port" 2>"$dir/ddprund.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done

echo "== ddprun rendezvous, agents as threads, against ddprund 127.0.0.1:$(cat "$dir/port") =="
"$BUILD_DIR/bin/rdzv_bench" --endpoint "127.0.0.1:$(cat "$dir/port")" --agents "$SMALL_N" \
  --reps "$REPS" --detect-reps 0
echo "== torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') c10d rendezvous, agents as processes, against a ddprund =="
"$venv/bin/python" bench/torch_rdzv_bench.py --ddprund "$BUILD_DIR/bin/ddprund" \
  --agents "$SMALL_N" --reps "$REPS"
echo "== ddprun rendezvous at scale (in-process server) and detection latency =="
"$BUILD_DIR/bin/rdzv_bench" --agents "$LARGE_N" --reps "$REPS" --lease-ms "${LEASE_MS:-1000}"
