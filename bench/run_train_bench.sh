#!/usr/bin/env bash
# Side-by-side training benchmark: (a) ddp-train under ddprun against PyTorch DDP under torchrun
# (bench/torch_ddp_train.py), the same MLP on Fashion-MNIST with the same settings (Adam, lr
# 1e-3, BATCH_SIZE per rank, 1 thread per rank, gloo); (b) all-reduce bandwidth of our gloo
# communicator (ddp_allreduce_bench) against torch's gloo (bench/torch_allreduce_bench.py).
# The two sides alternate in every rep (ours, torch, ours, torch, ...); tables report medians.
#
# Reproduce: bash bench/run_train_bench.sh
# Environment (defaults in brackets):
#   BUILD_DIR [build] (has bin/ddprun, bin/ddp-train, bin/ddp_allreduce_bench; not built here)
#   DDP_TORCH2_PYTHON [/root/.cache/ddprun/torch-venv/bin/python] (torch 2.x; torchrun is
#     `$PY -m torch.distributed.run`)
#   NPROC [2]  BATCH_SIZE [64]  EPOCHS [2]  REPS [2]  SEED [0]  TRAIN_SUBSET [0: all 60000]
#   SIZES [4K,16K,64K,256K,1M,4M,16M,64M]  TARGET_S [0.5] (timed seconds per size)
#   SKIP_TRAIN [0]  SKIP_ALLREDUCE [0]  TIMEOUT_S [900] (per run)  RESULTS_DIR [bench/results]
# Raw JSON and logs: RESULTS_DIR/train_bench-STAMP/; tables: RESULTS_DIR/train_bench.md (and a
# copy in the stamped folder).
# Quick run: REPS=1 EPOCHS=1 TRAIN_SUBSET=6000 SIZES=4K,1M TARGET_S=0.2 bash bench/run_train_bench.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Run in a network namespace with only loopback, as the other benches do: both sides' gloo
# stays on loopback and sees the same quiet network.
if [[ -z "${DDP_IN_LOOPBACK_NS:-}" ]]; then
  DDP_IN_LOOPBACK_NS=1 exec scripts/loopback_only.sh bash bench/run_train_bench.sh "$@"
fi

BUILD_DIR=${BUILD_DIR:-build}
PY=${DDP_TORCH2_PYTHON:-/root/.cache/ddprun/torch-venv/bin/python}
NPROC=${NPROC:-2}
BATCH_SIZE=${BATCH_SIZE:-64}
EPOCHS=${EPOCHS:-2}
REPS=${REPS:-2}
SEED=${SEED:-0}
TRAIN_SUBSET=${TRAIN_SUBSET:-0}
SIZES=${SIZES:-4K,16K,64K,256K,1M,4M,16M,64M}
TARGET_S=${TARGET_S:-0.5}
SKIP_TRAIN=${SKIP_TRAIN:-0}
SKIP_ALLREDUCE=${SKIP_ALLREDUCE:-0}
TIMEOUT_S=${TIMEOUT_S:-900}
RESULTS_DIR=${RESULTS_DIR:-bench/results}

DDPRUN=$BUILD_DIR/bin/ddprun
needed=("$DDPRUN")
((SKIP_TRAIN)) || needed+=("$BUILD_DIR/bin/ddp-train")
((SKIP_ALLREDUCE)) || needed+=("$BUILD_DIR/bin/ddp_allreduce_bench")
for exe in "${needed[@]}"; do
  if [[ ! -x $exe ]]; then
    echo "run_train_bench: $exe not found; build it first (ninja -C $BUILD_DIR ddprun ddp-train ddp_allreduce_bench)" >&2
    exit 2
  fi
done
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "run_train_bench: no python with torch at $PY (scripts/setup.sh --with-torch, or set DDP_TORCH2_PYTHON)" >&2
  exit 2
fi
TORCHRUN=("$PY" -m torch.distributed.run)

# Nothing from an enclosing job may configure either launcher or the workers.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT LOGLEVEL
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(PET_|TORCHELASTIC_)' || true)
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$RESULTS_DIR/train_bench-$STAMP
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the workers get these paths
TABLE=$RESULTS_DIR/train_bench.md
FAILURES=()

# run_one NAME LOG CMD...: one launcher run under a timeout; a failure is recorded, not fatal.
run_one() {
  local name=$1 log=$2 rc=0 t0 t1
  shift 2
  t0=$(date +%s.%N)
  timeout -k 10 "$TIMEOUT_S" "$@" </dev/null >"$log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  printf '  %-28s rc %d, %s s wall\n' "$name" "$rc" "$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")" >&2
  if ((rc != 0)); then
    FAILURES+=("$name: exit $rc (log: $log)")
    tail -n 5 "$log" | sed 's/^/    /' >&2
  fi
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)')

if ! ((SKIP_TRAIN)); then
  echo "== (a) training: ddp-train vs torch DDP, $NPROC ranks, batch $BATCH_SIZE/rank, $EPOCHS epochs, $REPS reps ==" >&2
  for rep in $(seq "$REPS"); do
    # A new seed per rep, the same for both sides: accuracy compares over seeds, not one draw.
    common=(--batch-size "$BATCH_SIZE" --optimizer adam --lr 1e-3 --threads 1
            --seed "$((SEED + rep - 1))")
    ((TRAIN_SUBSET > 0)) && common+=(--train-subset "$TRAIN_SUBSET")
    run_one "ddp-train rep $rep" "$OUT/train-ours-$rep.log" \
      "$DDPRUN" --standalone --nproc-per-node="$NPROC" --no-python "$BUILD_DIR/bin/ddp-train" \
      --model mlp --dataset fashion-mnist "${common[@]}" --snapshot "" \
      --metrics-json "$OUT/train-ours-$rep.json" "$EPOCHS" 0
    run_one "torch DDP rep $rep" "$OUT/train-torch-$rep.log" \
      "${TORCHRUN[@]}" --standalone --nproc-per-node="$NPROC" bench/torch_ddp_train.py \
      "${common[@]}" --epochs "$EPOCHS" --metrics-json "$OUT/train-torch-$rep.json"
  done
fi

if ! ((SKIP_ALLREDUCE)); then
  ar=(--sizes "$SIZES" --target-s "$TARGET_S")
  echo "== (b) all-reduce: ddp_allreduce_bench vs torch gloo, $NPROC ranks, $REPS reps ==" >&2
  for rep in $(seq "$REPS"); do
    check=()
    ((rep == 1)) && check=(--check)
    run_one "ddp_allreduce_bench rep $rep" "$OUT/allreduce-ours-$rep.log" \
      "$DDPRUN" --standalone --nproc-per-node="$NPROC" --no-python \
      "$BUILD_DIR/bin/ddp_allreduce_bench" "${ar[@]}" "${check[@]}" \
      --out "$OUT/allreduce-ours-$rep.json"
    run_one "ddp_allreduce_bench --no-shm rep $rep" "$OUT/allreduce-gloo-$rep.log" \
      "$DDPRUN" --standalone --nproc-per-node="$NPROC" --no-python \
      "$BUILD_DIR/bin/ddp_allreduce_bench" "${ar[@]}" "${check[@]}" --no-shm \
      --out "$OUT/allreduce-gloo-$rep.json"
    run_one "torch all_reduce rep $rep" "$OUT/allreduce-torch-$rep.log" \
      "${TORCHRUN[@]}" --standalone --nproc-per-node="$NPROC" bench/torch_allreduce_bench.py \
      "${ar[@]}" "${check[@]}" --out "$OUT/allreduce-torch-$rep.json"
  done
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

subset_note=
((TRAIN_SUBSET > 0)) && subset_note=" (first $TRAIN_SUBSET training samples)"
META="Train benchmark $STAMP: ddprun ($BUILD_DIR) vs torch $TORCH_VERSION, $NPROC ranks on \
$(getconf _NPROCESSORS_ONLN) cores, loadavg $LOAD_BEFORE before, $LOAD_AFTER after; OMP_NUM_THREADS=1; $REPS reps, \
the two sides alternated." \
SETTINGS="mlp on Fashion-MNIST$subset_note, Adam lr 1e-3, \
batch $BATCH_SIZE per rank, $EPOCHS epochs, seed $SEED + rep - 1, 1 thread per rank, gloo" \
  python3 - "$OUT" "$REPS" "${FAILURES[@]}" <<'EOF' | tee "$OUT/train_bench.md"
import json, os, statistics, sys
from pathlib import Path

out, reps, failures = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]


def load(name):
    p = out / name
    try:
        return json.loads(p.read_text()) if p.exists() else None
    except ValueError:
        return None


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def human(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


lines = [os.environ["META"], ""]
train = {s: [load(f"train-{s}-{r}.json") for r in range(1, reps + 1)] for s in ("ours", "torch")}
if any(any(runs) for runs in train.values()) or (out / "train-ours-1.log").exists():
    lines += [f"(a) Training: {os.environ['SETTINGS']}.", "",
              "| rep | ddp-train samples/s | torch DDP samples/s | ours/torch | "
              "ddp-train train s | torch train s | ddp-train test acc | torch test acc |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    get = lambda m, k: None if m is None else m.get(k)
    for r in range(reps):
        o, t = train["ours"][r], train["torch"][r]
        lines.append(
            f"| {r + 1} | {fmt(get(o, 'samples_per_sec'), ',.0f')} | "
            f"{fmt(get(t, 'samples_per_sec'), ',.0f')} | "
            f"{ratio(get(o, 'samples_per_sec'), get(t, 'samples_per_sec'))} | "
            f"{fmt(get(o, 'train_seconds'), '.2f')} | {fmt(get(t, 'train_seconds'), '.2f')} | "
            f"{fmt(get(o, 'test_accuracy'), '.4f')} | {fmt(get(t, 'test_accuracy'), '.4f')} |")
    mo = {k: med([get(m, k) for m in train["ours"]]) for k in
          ("samples_per_sec", "train_seconds", "test_accuracy")}
    mt = {k: med([get(m, k) for m in train["torch"]]) for k in mo}
    lines += [f"| **median** | **{fmt(mo['samples_per_sec'], ',.0f')}** | "
              f"**{fmt(mt['samples_per_sec'], ',.0f')}** | "
              f"**{ratio(mo['samples_per_sec'], mt['samples_per_sec'])}** | "
              f"{fmt(mo['train_seconds'], '.2f')} | {fmt(mt['train_seconds'], '.2f')} | "
              f"{fmt(mo['test_accuracy'], '.4f')} | {fmt(mt['test_accuracy'], '.4f')} |", "",
              "samples/s: samples of all ranks over the timed training loop (rank 0's clock); "
              "test accuracy: rank 0 on the 10000 test images after training.", ""]

ar = {s: [load(f"allreduce-{s}-{r}.json") or [] for r in range(1, reps + 1)]
      for s in ("ours", "gloo", "torch")}
if any(any(runs) for runs in ar.values()) or (out / "allreduce-ours-1.log").exists():
    def per_size(side, key):
        vals = {}
        for run in ar[side]:
            for row in run:
                vals.setdefault(row["bytes"], []).append(row[key])
        return {b: med(v) for b, v in vals.items()}

    bo, bt = per_size("ours", "busbw_gbps"), per_size("torch", "busbw_gbps")
    to, tt = per_size("ours", "time_us"), per_size("torch", "time_us")
    bg, tg = per_size("gloo", "busbw_gbps"), per_size("gloo", "time_us")
    lines += ["(b) All-reduce (SUM, float32, CPU), median over reps; busbw = bytes / time * "
              "2(n-1)/n. ours: ddp_allreduce_bench as ddp-train runs it (ranks on one host: "
              "shared memory); ours gloo: the same with --no-shm (Gloo's TCP ring); torch: "
              "torch.distributed.all_reduce on gloo.", "",
              "| size | ours µs/op | ours gloo µs/op | torch µs/op | ours busbw GB/s | "
              "ours gloo busbw GB/s | torch busbw GB/s | ours/torch | ours gloo/torch |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in sorted(set(bo) | set(bt) | set(bg)):
        lines.append(f"| {human(b)} | {fmt(to.get(b), ',.1f')} | {fmt(tg.get(b), ',.1f')} | "
                     f"{fmt(tt.get(b), ',.1f')} | {fmt(bo.get(b), '.3f')} | "
                     f"{fmt(bg.get(b), '.3f')} | {fmt(bt.get(b), '.3f')} | "
                     f"{ratio(bo.get(b), bt.get(b))} | {ratio(bg.get(b), bt.get(b))} |")
    lines.append("")
if failures:
    lines += [f"Failures ({len(failures)}):"] + [f"- {f}" for f in failures] + [""]
print("\n".join(lines), end="")
EOF
cp "$OUT/train_bench.md" "$TABLE"
echo "raw results and logs: $OUT" >&2
echo "table: $TABLE" >&2
((${#FAILURES[@]} == 0))
