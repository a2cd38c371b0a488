#!/usr/bin/env bash
# The whole CUDA path checked in one command, for the first time a GPU is at hand (issue 37):
#   1. the GPU unit tests (ddp_gpu_tests: kernels against their CPU references, devices, engines);
#   2. ddp-train --device cuda against --device cpu, one rank, for every model and sharding level
#      the CUDA engines run (mlp, autoencoder, linear x none, optimizer, gradients, full): every
#      step's loss equal within 1e-3 relative; and bf16 against fp32 (finite, within 10%, falling);
#   3. compute-sanitizer memcheck on a short cuda run (when compute-sanitizer is installed);
#   4. the kernel bench (each kernel's bandwidth as a share of the device's own copy).
# It prints one table and exits 0 when every check passed, 1 when one failed, 77 when no CUDA
# device is visible (every row then says so), 2 on bad usage or a missing build.
#
# Usage: scripts/gpu_check.sh [--no-build] [--build-dir DIR] [--steps N] [--self-test]
#   --no-build      use DIR as it is (default: configure and build its GPU targets first)
#   --build-dir     the CUDA build tree (default build-cuda; DDP_GPU_CHECK_BUILD_DIR)
#   --steps N       optimizer steps per comparison run, 2..200 (default 20)
#   --self-test     compare the CPU path against itself (no GPU needed): tests this script's
#                   runs, comparisons and table on a machine without a GPU
# Reproduce on a GPU machine: scripts/gpu_check.sh   (under 8 minutes on one H100/H200)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The test harness's variables (tests/conftest.py, skip.hpp) are not this script's: a GPU test
# binary run from here must not report into the suite that runs the script.
unset DDP_TEST_REPORT DDP_SUITE

usage() { sed -n '/^# Usage:/,/^# Reproduce/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
bad() { echo "gpu_check: $1" >&2; exit 2; }

BUILD_DIR=${DDP_GPU_CHECK_BUILD_DIR:-build-cuda}
build=1 steps=20 self_test=0
while (($#)); do
  case "$1" in
    --no-build) build=0 ;;
    --build-dir) (($# >= 2)) || bad "--build-dir needs a folder"; BUILD_DIR=$2; shift ;;
    --build-dir=*) BUILD_DIR=${1#*=} ;;
    --steps) (($# >= 2)) || bad "--steps needs a number"; steps=$2; shift ;;
    --steps=*) steps=${1#*=} ;;
    --self-test) self_test=1 ;;
    -h|--help) usage ;;
    *) bad "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ $steps =~ ^[0-9]+$ ]] && ((steps >= 2 && steps <= 200)) ||
  bad "--steps '$steps' is not a number in 2..200"

DEADLINE=$((SECONDS + 480))  # the 8-minute budget: a check that would pass it is not started
dev=cuda dut_args=""
# The self-test's device-under-test runs may get extra ddp-train flags (its own test uses this to
# see a mismatch named); a real check takes none.
((self_test)) && dev=cpu dut_args=${DDP_GPU_CHECK_SELF_TEST_ARGS:-}
rows=()  # "check|result|detail|seconds"
failed=0
row() { rows+=("$1|$2|$3|$4"); [[ $2 == FAILED ]] && failed=$((failed + 1)); return 0; }
table() {
  printf '\n| check | result | detail | s |\n|---|---|---|---:|\n'
  local r
  for r in "${rows[@]}"; do IFS='|' read -r c res d s <<<"$r"; printf '| %s | %s | %s | %s |\n' "$c" "$res" "$d" "$s"; done
}

if ((build)); then
  command -v nvcc >/dev/null || bad "nvcc is not on PATH (export PATH=/usr/local/cuda/bin:\$PATH)"
  echo "gpu_check: building $BUILD_DIR (cmake -DDDP_WITH_CUDA=ON; ninja ddp_gpu_tests ddp-train ddprun kernel_bench)" >&2
  cmake -S . -B "$BUILD_DIR" -G Ninja -DDDP_BUILD_TESTS=ON -DDDP_WITH_CUDA=ON >/dev/null &&
    ninja -C "$BUILD_DIR" ddp_gpu_tests ddp-train ddprun kernel_bench >/dev/null ||
    bad "the build of $BUILD_DIR failed (run the two commands above to see why)"
fi
BIN=$BUILD_DIR/bin
for prog in ddp_gpu_tests ddp-train ddprun kernel_bench; do
  [[ -x $BIN/$prog ]] || bad "$BIN/$prog is missing: build it (scripts/gpu_check.sh without --no-build)"
done
work=$(mktemp -d /tmp/ddprun-gpu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Is a device visible? ddp_gpu_tests exits 77 when it finds none (CUDA_VISIBLE_DEVICES included).
"$BIN/ddp_gpu_tests" --list-tests >/dev/null 2>&1
have_gpu=$?
if ((have_gpu == 77 && !self_test)); then
  why="no CUDA device visible to this process"
  for c in "GPU unit tests" "cuda = cpu (3 models x 4 sharding levels)" "bf16 trains" \
           "memcheck" "kernel bench"; do row "$c" skipped "$why" 0; done
  table
  echo "gpu_check: $why (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}): nothing was checked" >&2
  exit 77
fi

timed() {  # timed SECONDS LOG COMMAND...: run it, output to LOG; its exit status
  local limit=$1 log=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  ((left > 5)) || { echo "gpu_check: the 8-minute budget is spent" >"$log"; return 124; }
  timeout -k 10 "$((limit < left ? limit : left))" "$@" >"$log" 2>&1
}

# 1. The GPU unit tests.
t0=$SECONDS
if ((self_test)); then
  row "GPU unit tests" skipped "self-test: the CPU path only" 0
elif timed 240 "$work/unit.log" "$BIN/ddp_gpu_tests"; then
  row "GPU unit tests" passed "$(grep -oE 'All tests passed.*' "$work/unit.log" | head -1)" $((SECONDS - t0))
else
  row "GPU unit tests" FAILED "$(grep -E 'test cases:' "$work/unit.log" | tail -1) (log: see below)" $((SECONDS - t0))
  tail -n 40 "$work/unit.log" >&2
fi

# 2. cuda against cpu, every model and sharding level the CUDA engines run.
train() {  # train DEVICE NAME ARGS...: one rank; the metrics land in $work/NAME.json
  local device=$1 name=$2; shift 2
  timed 120 "$work/$name.log" "$BIN/ddprun" --standalone --nproc-per-node=1 --no-python \
    "$BIN/ddp-train" 1 0 --no-eval --snapshot "" --threads 1 --max-steps "$steps" \
    --device "$device" --metrics-json "$work/$name.json" "$@"
}
# The linear model trains on synthetic data; mlp and autoencoder take Fashion-MNIST's 784 inputs.
FMNIST=${DDP_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
data_args() {  # data_args MODEL: the dataset flags, or nothing when its data is missing
  case $1 in
    linear) echo "--dataset synthetic --synthetic-size 4096" ;;
    *) [[ -f $FMNIST/train-images-idx3-ubyte.gz || -f $FMNIST/train-images-idx3-ubyte ]] &&
         echo "--dataset fashion-mnist --data $FMNIST --train-subset 4096" ;;
  esac
}
compare=$(cat <<'EOF_PY'
import json, math, sys
a, b, steps = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
la, lb = a.get("step_losses", []), b.get("step_losses", [])
if len(la) != steps or len(lb) != steps:
    sys.exit(f"{len(la)} and {len(lb)} step losses, not {steps}")
worst = max(abs(x - y) / max(1.0, abs(x)) for x, y in zip(la, lb))
if not all(math.isfinite(x) for x in la + lb) or worst > 1e-3:
    i = max(range(steps), key=lambda i: abs(la[i] - lb[i]))
    sys.exit(f"step {i}: cpu {la[i]:.6g}, {sys.argv[4]} {lb[i]:.6g} (relative {worst:.2e} > 1e-3)")
print(f"worst relative step-loss difference {worst:.1e}")
EOF_PY
)
t0=$SECONDS
pairs=0 bad_pairs=() no_data=0
for model in mlp autoencoder linear; do
  read -ra data <<<"$(data_args "$model")"
  if ((${#data[@]} == 0)); then no_data=$((no_data + 4)); continue; fi
  for sharding in none optimizer gradients full; do
    name=$model-$sharding
    if ! train cpu "$name-ref" --model "$model" --sharding "$sharding" "${data[@]}" ||
       ! train "$dev" "$name-dut" --model "$model" --sharding "$sharding" "${data[@]}" $dut_args; then
      bad_pairs+=("$name: a run failed: $(grep -m1 -iE 'error|failed' "$work/$name-"*.log | head -1 | cut -c1-160)")
      continue
    fi
    if ! msg=$(python3 -c "$compare" "$work/$name-ref.json" "$work/$name-dut.json" "$steps" "$dev" 2>&1); then
      bad_pairs+=("$name: $msg")
    fi
    pairs=$((pairs + 1))
  done
done
missing=""
((no_data)) && missing="; $no_data pairs not run: no Fashion-MNIST in $FMNIST (DDP_FMNIST_DIR)"
if ((${#bad_pairs[@]} == 0 && pairs == 0)); then
  row "cuda = cpu (3 models x 4 sharding levels)" FAILED "no pair ran$missing" $((SECONDS - t0))
elif ((${#bad_pairs[@]} == 0)); then
  row "cuda = cpu (3 models x 4 sharding levels)" passed "$pairs pairs, $steps steps each, within 1e-3 ($dev)$missing" $((SECONDS - t0))
else
  row "cuda = cpu (3 models x 4 sharding levels)" FAILED "${#bad_pairs[@]} of 12 pairs: ${bad_pairs[0]}" $((SECONDS - t0))
  printf 'gpu_check: %s\n' "${bad_pairs[@]}" >&2
fi

# bf16 against fp32 on cuda, same model, data and seed: every loss finite, the last quarter's mean
# within 10% of fp32's, and falling on real data (scripts/gpu_check_summary.py; no bit-match with
# fp32 expected). The MLP on Fashion-MNIST when the data is there; else the linear model on
# synthetic data, whose per-step loss is too noisy to fall in a few steps.
t0=$SECONDS msg=""
read -ra mlp_data <<<"$(data_args mlp)"
if ((${#mlp_data[@]})); then bf16_run=(--model mlp "${mlp_data[@]}") falls=--falls
else bf16_run=(--model linear --dataset synthetic) falls=""; fi
if ((self_test)); then
  row "bf16 trains" skipped "self-test: bf16 is cuda only" 0
elif train cuda bf16-ref "${bf16_run[@]}" && train cuda bf16 "${bf16_run[@]}" --precision bf16 &&
     msg=$(python3 scripts/gpu_check_summary.py bf16 "$work/bf16-ref.json" "$work/bf16.json" "$steps" $falls 2>&1); then
  row "bf16 trains" passed "${bf16_run[1]}: $msg" $((SECONDS - t0))
else
  row "bf16 trains" FAILED "${msg:-a run failed: $(tail -n 3 "$work/bf16"*.log | tr '\n' ' ' | cut -c1-160)}" $((SECONDS - t0))
fi

# 3. memcheck on a short cuda run (every process ddprun starts is followed).
t0=$SECONDS
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if ((self_test)); then
  row "memcheck" skipped "self-test" 0
elif [[ -z $sanitizer ]]; then
  row "memcheck" skipped "compute-sanitizer is not installed (the CUDA toolkit's package)" 0
else
  if timed 240 "$work/memcheck.log" "$sanitizer" --tool memcheck --error-exitcode 99 \
       --target-processes all "$BIN/ddprun" --standalone --nproc-per-node=1 --no-python \
       "$BIN/ddp-train" 1 0 --dataset synthetic --synthetic-size 512 --no-eval --snapshot "" \
       --max-steps 3 --device cuda --model linear; then
    row "memcheck" passed "$(grep -oE 'ERROR SUMMARY: [0-9]+ errors' "$work/memcheck.log" | sort -u | tr '\n' ' ')" $((SECONDS - t0))
  else
    row "memcheck" FAILED "$(grep -m1 -E 'ERROR SUMMARY|Invalid|error' "$work/memcheck.log" | cut -c1-160)" $((SECONDS - t0))
    tail -n 40 "$work/memcheck.log" >&2
  fi
fi

# 4. The kernel bench.
t0=$SECONDS msg=""
if ((self_test)); then
  row "kernel bench" skipped "self-test" 0
elif timed 120 "$work/kernels.log" "$BIN/kernel_bench" --json "$work/kernels.json" &&
     msg=$(python3 scripts/gpu_check_summary.py kernels "$work/kernels.json" 2>&1); then
  row "kernel bench" passed "$msg" $((SECONDS - t0))
  sed 's/^/  /' "$work/kernels.log" >&2
else
  row "kernel bench" FAILED "${msg:-$(tail -n 2 "$work/kernels.log" | tr '\n' ' ' | cut -c1-160)}" $((SECONDS - t0))
fi

table
echo "gpu_check: $failed failed, in ${SECONDS} s (device: $dev$( ((self_test)) && echo ', self-test'))"
((failed == 0))
