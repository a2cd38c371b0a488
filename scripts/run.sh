#!/usr/bin/env bash
# The main job, from a fresh machine: install, build, then serve with ddprund on a free port,
# make a client round trip (set, get, add, a wait released by another client) with ddpstore,
# and run a two-node ddprun job against it on this machine: 2 agents x 2 workers, one worker
# failing once so that both nodes restart together. Issue 5 replaces the worker with ddp-train.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
ninja -C build ddprund ddpstore ddprun

dir=$(mktemp -d)
build/bin/ddprund --host 127.0.0.1 --port 0 --port-file "$dir/port" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [[ -s "$dir/port" ]] && break; sleep 0.05; done
port=$(cat "$dir/port")
store() { build/bin/ddpstore --endpoint "127.0.0.1:$port" --timeout-ms 5000 "$@"; }

store set greeting "hello from ddprund"
echo "get greeting -> $(store get greeting)"
echo "add counter 5 -> $(store add counter 5)"
store wait released & waiter=$!
store set released yes
wait $waiter && echo "wait released -> ok"
echo "num-keys -> $(store num-keys)"

echo
echo "== two ddprun agents (2 workers each) rendezvous through ddprund; rank 3 fails once =="
cat >"$dir/worker.sh" <<'EOF_WORKER'
echo "rank $RANK of $WORLD_SIZE (node $GROUP_RANK, local $LOCAL_RANK), attempt $TORCHELASTIC_RESTART_COUNT"
if [ "$RANK" = 3 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then echo "rank 3 fails" >&2; exit 3; fi
EOF_WORKER
agents=()
for node in 0 1; do
  build/bin/ddprun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \
    --rdzv-endpoint="127.0.0.1:$port" --rdzv-id="demo-$$" --max-restarts=1 \
    --log-line-prefix-template='[node${group_rank} rank${rank}]: ' \
    --no-python /bin/sh "$dir/worker.sh" & agents+=($!)
done
for a in "${agents[@]}"; do wait "$a"; done
echo "both agents exited 0 after one restart of every node"
kill -TERM $daemon
wait $daemon && echo "ddprund stopped cleanly"
trap 'rm -rf "$dir"' EXIT
