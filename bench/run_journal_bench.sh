#!/usr/bin/env bash
# The cost of ddprund --data-dir (issue 32), side by side in one run: the store benchmark
# (store_loadgen mix on 1/64/1024 connections and the 4096-client storm) against ddprund
# without and with --data-dir (default fsync, then --fsync-interval 0), alternating, and
# ddprun's rendezvous round (bench/rdzv_bench.cpp) against each in turn. Results: docs/perf.md.
#
# Reproduce: bash bench/run_journal_bench.sh
# Environment: BUILD_DIR [build], REPS [5], AGENTS [2,8,64,256]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${DDP_IN_LOOPBACK_NS:-}" ]]; then
  DDP_IN_LOOPBACK_NS=1 exec scripts/loopback_only.sh bash bench/run_journal_bench.sh "$@"
fi
BUILD_DIR=${BUILD_DIR:-build}
REPS=${REPS:-5}
AGENTS=${AGENTS:-2,8,64,256}
bin=$BUILD_DIR/bin
for b in ddprund store_loadgen rdzv_bench; do
  [[ -x $bin/$b ]] || { echo "run_journal_bench: build $b first" >&2; exit 2; }
done
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "== store: ddprund without (base) and with --data-dir (new) =="
python3 bench/store_regression_bench.py --base "$bin/ddprund" --new "$bin/ddprund" \
  --new-args "--data-dir {tmp}/data" --loadgen "$bin/store_loadgen" --reps "$REPS"
echo "== store: without (base) and with --data-dir --fsync-interval 0 (new) =="
python3 bench/store_regression_bench.py --base "$bin/ddprund" --new "$bin/ddprund" \
  --new-args "--data-dir {tmp}/data --fsync-interval 0" --loadgen "$bin/store_loadgen" \
  --reps "$REPS" --conns 1,64 --storm 0

dir=$(mktemp -d)
start() {  # start NAME ARGS...: a ddprund, its port in $dir/NAME.port
  local name=$1; shift
  "$bin/ddprund" --host 127.0.0.1 --port 0 --port-file "$dir/$name.port" --http-port -1 "$@" \
    2>"$dir/$name.log" &
  echo $! >"$dir/$name.pid"
  for _ in $(seq 200); do [[ -s $dir/$name.port ]] && return; sleep 0.05; done
  echo "ddprund $name did not start" >&2; exit 1
}
trap 'for p in "$dir"/*.pid; do kill -TERM "$(cat "$p")" 2>/dev/null || true; done; sleep 0.5; rm -rf "$dir"' EXIT
start plain
start journal --data-dir "$dir/data"
# One rdzv_bench per store (its rounds' run ids are its own: a second one on the same store
# would wait for rounds that already ended).
for name in plain journal; do
  echo "== rendezvous round, ddprund $name =="
  "$bin/rdzv_bench" --endpoint "127.0.0.1:$(cat "$dir/$name.port")" --agents "$AGENTS" \
    --reps "$REPS" --detect-reps 0
done
