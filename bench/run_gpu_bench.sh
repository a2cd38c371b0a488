#!/usr/bin/env bash
# GPU benchmarks of issue 6, side by side in one run, on a machine with an NVIDIA GPU:
#   1. kernel_bench: each memory-bound kernel's achieved bandwidth against the device's own
#      device-to-device copy (target >= 80%);
#   2. ddp-train --device cuda against PyTorch DDP (nccl) on the same GPU: the same MLP, batch,
#      optimizer and epochs, 1 rank each (one GPU), samples/s and step time (target: ours at or
#      below torch's step time), alternated REPS times;
#   3. the gradient buffer's (940 KB) NCCL all-reduce latency on one GPU, through torch.
# Run on an H100 on 2026-11-25: figures in docs/perf.md ("GPU path").
# Reproduce (after `cmake -B build-cuda -DDDP_WITH_CUDA=ON && ninja -C build-cuda ddprun
# ddp-train kernel_bench`): BUILD_DIR=build-cuda bash bench/run_gpu_bench.sh
# Environment: BUILD_DIR [build-cuda]  DDP_TORCH2_PYTHON [~/.cache/ddprun/torch-venv/bin/python]
#   BATCH_SIZE [64]  EPOCHS [2]  REPS [3]  PRECISION [fp32]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
PY=${DDP_TORCH2_PYTHON:-$HOME/.cache/ddprun/torch-venv/bin/python}
BATCH_SIZE=${BATCH_SIZE:-64}
EPOCHS=${EPOCHS:-2}
REPS=${REPS:-3}
PRECISION=${PRECISION:-fp32}
OUT=bench/results/gpu_bench-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
export OMP_NUM_THREADS=1

set +e
"$BUILD_DIR/bin/kernel_bench" --json "$OUT/kernels.json" | tee "$OUT/kernels.md"
rc=${PIPESTATUS[0]}
set -e
if ((rc == 77)); then echo "run_gpu_bench: no GPU here; nothing measured" >&2; exit 77; fi
((rc == 0)) || exit "$rc"

common=(--batch-size "$BATCH_SIZE" --optimizer adam --lr 1e-3 --threads 1)
for rep in $(seq "$REPS"); do
  "$BUILD_DIR/bin/ddprun" --standalone --nproc-per-node=1 "$BUILD_DIR/bin/ddp-train" \
    "${common[@]}" --device cuda --precision "$PRECISION" --snapshot "" --seed "$rep" \
    --metrics-json "$OUT/ours-$rep.json" "$EPOCHS" 0 >"$OUT/ours-$rep.log" 2>&1
  "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 bench/torch_ddp_train.py \
    "${common[@]}" --device cuda --seed "$rep" --epochs "$EPOCHS" \
    --metrics-json "$OUT/torch-$rep.json" >"$OUT/torch-$rep.log" 2>&1
done

"$PY" - "$OUT" "$REPS" <<'EOF_PY' | tee "$OUT/gpu_bench.md"
import json, statistics, sys
from pathlib import Path
out, reps = Path(sys.argv[1]), int(sys.argv[2])
load = lambda n: json.loads((out / n).read_text())
rows = []
for r in range(1, reps + 1):
    o, t = load(f"ours-{r}.json"), load(f"torch-{r}.json")
    so, st = o["train_seconds"] / o["steps"] * 1e3, t["train_seconds"] / t["steps"] * 1e3
    rows.append((r, o["samples_per_sec"], t["samples_per_sec"], so, st,
                 o.get("test_accuracy"), t.get("test_accuracy")))
print("| rep | ddp-train samples/s | torch samples/s | ddp-train ms/step | torch ms/step | "
      "ours/torch step time | ddp-train acc | torch acc |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r, ao, at, so, st, acc_o, acc_t in rows:
    print(f"| {r} | {ao:,.0f} | {at:,.0f} | {so:.3f} | {st:.3f} | {so / st:.2f} | "
          f"{acc_o:.4f} | {acc_t:.4f} |")
print(f"median step time ratio (ours/torch): {statistics.median(r[3] / r[4] for r in rows):.2f}")
EOF_PY

# The gradient buffer's all-reduce on one GPU (world size 1 still runs NCCL's kernel).
"$PY" - <<'EOF_PY' | tee "$OUT/nccl.md"
import os, time, torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(235146, device="cuda")
for _ in range(20): dist.all_reduce(x)
torch.cuda.synchronize(); t = time.perf_counter(); n = 1000
for _ in range(n): dist.all_reduce(x)
torch.cuda.synchronize()
print(f"NCCL all-reduce of the mlp's gradients (940 KB), 1 GPU: {(time.perf_counter() - t) / n * 1e6:.1f} us")
dist.destroy_process_group()
EOF_PY
echo "results: $OUT" >&2
