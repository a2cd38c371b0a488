#!/usr/bin/env bash
# The main job, from a fresh machine: install, build, then
#   1. train the MLP on Fashion-MNIST with ddp-train, 2 ranks under `ddprun --standalone`, to at
#      least 84% test accuracy (checked), printing progress;
#   2. serve with ddprund on a free port, make a client round trip with ddpstore, and run a
#      two-node ddprun job against it on this machine: 2 agents x 1 ddp-train worker, rank 1
#      killed mid-training once and replaced alone, healed from rank 0's state (in-place
#      recovery, ddp-train's default under ddprun).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
ninja -C build ddprund ddpstore ddprun ddp-train

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "== ddp-train: MLP on Fashion-MNIST, 2 ranks, Adam, batch 64 per rank, 3 epochs =="
build/bin/ddprun --standalone --nproc-per-node=2 build/bin/ddp-train --optimizer adam --lr 1e-3 \
  --batch-size 64 --snapshot "$dir/mlp.ddp" --metrics-json "$dir/mlp.json" 3 1
python3 - "$dir/mlp.json" <<'EOF_CHECK'
import json, sys
m = json.load(open(sys.argv[1]))
acc = m["test_accuracy"]
print(f"test accuracy {acc:.4f} after {m['epochs_run']} epochs, {m['samples_per_sec']:.0f} samples/s")
sys.exit(0 if acc >= 0.84 else f"test accuracy {acc:.4f} is below 0.84")
EOF_CHECK
echo

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
echo "== two ddprun agents rendezvous through ddprund; ddp-train rank 1 is killed at step 300 and healed in place =="
agents=()
for node in 0 1; do
  DDP_TRAIN_FAULT=1:300 build/bin/ddprun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \
    --rdzv-endpoint="127.0.0.1:$port" --rdzv-id="demo-$$" --max-restarts=1 \
    --log-line-prefix-template='[node${group_rank} rank${rank}]: ' \
    build/bin/ddp-train --optimizer adam --batch-size 64 --train-subset 20000 --log-every 100 \
    --snapshot "$dir/demo.ddp" 2 1 & agents+=($!)
done
for a in "${agents[@]}"; do wait "$a"; done
echo "both agents exited 0: rank 1 was replaced alone and took rank 0's state (no restart, no disk read)"
kill -TERM $daemon
wait $daemon && echo "ddprund stopped cleanly"
trap 'rm -rf "$dir"' EXIT
