#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install (torch 2.x venv included), then
#   1. build/       warnings as errors; unit, integration, hostile, layout and the GPU suite
#                   (skipped without a GPU) under ctest
#   1b. tests/slurm: the sbatch scripts in slurm/ on a real local 2-node Slurm cluster
#   1c. scripts/mutants.py: a few chosen conditions flipped one at a time, their tests must fail
#   2. build-asan/  ASan+UBSan build of the CPU tests (unit + integration), and the interop
#                   suites (torch 2.x, torch 1.13, torchrun, PyTorch references) against the
#                   sanitized binaries: they run once, here (docs/decisions.md)
#   2b. build-tsan/ ThreadSanitizer build of unit + integration
#   3. build-fuzz/  clang libFuzzer run of the decoder+dispatch for $DDP_FUZZ_SECONDS (60)
#   4. build-cuda/  DDP_WITH_CUDA=ON: the CUDA code compiles and links (when nvcc exists)
#   5. clang-format --dry-run over every C++/CUDA file
#   6. packages: the wheel and the .deb (scripts/build_packages.sh, ccache-warm from build/),
#                the wheel in a fresh venv and a bare Debian root, the .deb installed and purged
# Every tree is a unity build (8 sources a unit) and the sanitized ones compile at -O1: the cold
# run's figures are in docs/testing.md. Tests run in a network namespace with only loopback
# (scripts/loopback_only.sh).
# Ends with one line: "tests: N passed, M failed, K skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scripts/setup.sh --with-torch || exit 1
setup_s=$SECONDS
venv="${DDP_TORCH_VENV:-$HOME/.cache/ddprun/torch-venv}"
export PATH="/usr/local/cuda/bin:$PATH"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# ccache across clones: paths below the repository are hashed relative to it, so a fresh clone
# (CI) reuses what an earlier build of the same sources compiled.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1

passed=0 failed=0 skipped=0
# Each phase's wall time, printed at the end ("times: ..."), so a slow phase shows by name.
phase_names=() phase_start=$SECONDS times=""
note() {
  [[ ${#phase_names[@]} -gt 0 ]] && times+="${phase_names[-1]%%.*}:$((SECONDS - phase_start))s "
  phase_names+=("$1"); phase_start=$SECONDS
  printf '\n=== %s === (%d s since start)\n' "$*" "$SECONDS"
}
# A tool the set-up installs and a test finds missing fails the run (tests/support/skip.hpp,
# tests/support/pytest_tools.py): here a missing tool is a broken set-up.
export DDP_REQUIRE_TOOLS=1
skip_lines=""  # every skip's "skipped: SUITE: TEST: REASON", printed at the end
fail_lines=""  # every failure's "failed: SUITE[: TEST]", printed last: CI shows the log's tail
# Runs ctest in dir $1 (extra args after), adding its counts to the totals: each pytest file's
# tests one by one (tests/conftest.py reports them; scripts/count_tests.py reads both).
run_ctest() {
  local dir=$1; shift
  local log report t0=$SECONDS
  log=$(mktemp) report=$(mktemp)
  (cd "$dir" && DDP_TEST_REPORT="$report" \
     "$root/scripts/loopback_only.sh" ctest --output-on-failure --no-tests=error -j2 "$@") 2>&1 | tee "$log"
  times+="(tests-$dir:$((SECONDS - t0))s) "
  local counts p f s
  if grep -qE 'tests failed out of [0-9]+' "$log" && counts=$(scripts/count_tests.py "$log" "$report"); then
    read -r p f s <<<"$(head -1 <<<"$counts")"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    skip_lines+=$(tail -n +2 <<<"$counts" | grep '^skipped: ' | sed "s|^skipped: |skipped ($dir): |")$'\n'
    fail_lines+=$(tail -n +2 <<<"$counts" | grep '^failed: ' | sed "s|^failed: |failed ($dir): |")$'\n'
  else
    failed=$((failed + 1)); fail_lines+="failed ($dir): ctest ran no test or its log could not be read"$'\n'
  fi
  rm -f "$log" "$report"
}
fail() {  # fail NAME: one failure, named again at the end
  echo "FAILED: $1"; failed=$((failed + 1)); fail_lines+="failed: $1"$'\n'
}
step() {  # step NAME COMMAND...: one pass/fail entry
  if "${@:2}"; then passed=$((passed + 1)); else fail "$1"; fi
}

unity=-DCMAKE_UNITY_BUILD=ON
note "1. build (warnings as errors) + unit, integration, hostile, layout, gpu"
if cmake -S . -B build -G Ninja $unity -DDDP_BUILD_TESTS=ON -DDDP_WERROR=ON -DDDP_TORCH2_PYTHON="$venv/bin/python" \
     -DDDP_TORCH113_PYTHON=/usr/bin/python3 >/dev/null && ninja -C build; then
  run_ctest build -LE '^interop$'  # the interop suites run in the ASan tree
else
  fail "build"
fi

note "1b. Slurm: the slurm/ scripts on a real 2-node Slurm cluster (its own network namespaces)"
# Not in loopback_only.sh's namespace: local_slurm.sh builds its nodes' namespaces and bridge
# itself, blackhole route first, and tears them down at the end.
run_pytest() {  # run_pytest SUITE ARGS...: one count per test, as run_ctest's
  local suite=$1 report rc counts p f s; shift
  report=$(mktemp)
  DDP_SUITE="$suite" DDP_TEST_REPORT="$report" "$venv/bin/python" -m pytest -q "$@"
  rc=$?
  counts=$(scripts/count_tests.py --pytest "$suite" "$rc" "$report") || counts="0 1 0"
  read -r p f s <<<"$(head -1 <<<"$counts")"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  skip_lines+=$(tail -n +2 <<<"$counts" | grep '^skipped: ')$'\n'
  fail_lines+=$(tail -n +2 <<<"$counts" | grep '^failed: ')$'\n'
  rm -f "$report"
}
if [[ -x build/bin/ddprun && -x build/bin/ddp-train ]]; then
  # The build's dirty pages to disk first: an fsync behind gigabytes of them stalls the machine
  # for minutes (tests/slurm/conftest.py); the jobs' files go on tmpfs.
  sync
  slurm_tmp=$(mktemp -d /dev/shm/ddprun-slurm-pytest.XXXXXX)
  run_pytest slurm tests/slurm --basetemp="$slurm_tmp"
  rm -rf "$slurm_tmp"
else
  fail "slurm (no build)"
fi

note "1c. mutants: chosen conditions flipped one at a time; their tests must fail"
# scripts/mutants.py rebuilds build/ around each mutant and puts every file back.
if [[ -x build/bin/ddp_unit_tests ]]; then step "mutants" scripts/mutants.py build; fi

note "2. ASan+UBSan: unit + integration, real torch 2.x clients and the chaos suite against a sanitized ddprund"
if cmake -S . -B build-asan -G Ninja $unity -DDDP_BUILD_TESTS=ON -DDDP_WERROR=ON -DDDP_SANITIZE=address,undefined \
     -DDDP_TORCH2_PYTHON="$venv/bin/python" -DDDP_TORCH113_PYTHON=/usr/bin/python3 >/dev/null &&
   ninja -C build-asan ddp_unit_tests ddp_integration_tests ddprund ddpstore ddprun ddp-train; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_ctest build-asan -R "^(unit|integration)/|^interop: |^chaos: "
else
  fail "sanitizer build"
fi

note "2b. TSan: unit + integration (the integration server runs three event loops)"
if cmake -S . -B build-tsan -G Ninja $unity -DDDP_BUILD_TESTS=ON -DDDP_WERROR=ON -DDDP_SANITIZE=thread \
     >/dev/null && ninja -C build-tsan ddp_unit_tests ddp_integration_tests; then
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" run_ctest build-tsan -R "^(unit|integration)/"
else
  fail "tsan build"
fi

note "3. libFuzzer: decoder + dispatch, ${DDP_FUZZ_SECONDS:-60} s"
fuzz() {
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja $unity -DDDP_FUZZ=ON -DDDP_BUILD_TESTS=ON \
    -DDDP_SANITIZE=address,undefined >/dev/null && ninja -C build-fuzz decoder_fuzz || return 1
  local corpus; corpus=$(mktemp -d)
  cp tests/fuzz/corpus/* "$corpus"/
  # A crash input lands in build-fuzz/ (never in the source tree); add it to tests/fuzz/corpus.
  build-fuzz/bin/decoder_fuzz -max_total_time="${DDP_FUZZ_SECONDS:-60}" -max_len=4096 \
    -artifact_prefix="$root/build-fuzz/" -print_final_stats=1 "$corpus" 2>&1 | tail -n 15
  local rc=${PIPESTATUS[0]}
  rm -rf "$corpus"
  return "$rc"
}
step "fuzz" fuzz

note "4. CUDA build (compile and link only unless a GPU is present)"
if command -v nvcc >/dev/null; then
  cuda() {
    cmake -S . -B build-cuda -G Ninja $unity -DDDP_BUILD_TESTS=ON -DDDP_WERROR=ON -DDDP_WITH_CUDA=ON \
      -DDDP_TORCH2_PYTHON="$venv/bin/python" >/dev/null &&
      ninja -C build-cuda ddp_kernels ddp_gpu_tests ddp_worker ddp-train kernel_bench ddprun || return 1
    # Without a GPU every test here is a visible skip. Its ctest summary would be the last
    # runner summary of the log, and CI reads "0 of 1 run" as "ran no test"; so its output goes
    # to a file and only counts (and failures) are printed.
    local log=build-cuda/ctest.log
    run_ctest build-cuda -R "^gpu" >"$log" 2>&1
    grep -E 'Test +#' "$log" | sed 's/^/  /'
    if grep -q "\*\*\*Failed" "$log"; then cat "$log"; fi
    # With a GPU, also the whole-job check of the GPU path against the CPU path.
    if build-cuda/bin/ddp_gpu_tests --list-tests >/dev/null 2>&1; [[ $? != 77 ]]; then
      # A GPU is here: a GPU path that cannot run fails (DDP_EXPECT_GPU), it does not skip.
      DDP_BIN_DIR="$root/build-cuda/bin" DDP_EXPECT_GPU=1 run_pytest "gpu: ddp-train on cuda = cpu" \
        tests/interop/test_ddp_train_variants.py -k gpu_steps_match
    fi
    return 0  # run_ctest counted the results
  }
  cuda || { fail "cuda build"; }
else
  echo "SKIPPED: nvcc not found"; skipped=$((skipped + 1))
fi

note "5. clang-format"
fmt() {
  local bad
  bad=$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror 2>&1 |
        grep -oE '^[^:]+\.(cpp|hpp|cu|cuh)' | sort -u)
  [[ -z "$bad" ]] || { echo "not clang-formatted: $bad"; return 1; }
}
step "clang-format" fmt

note "6. packages: the wheel (fresh venv, bare Debian root) and the .deb (dpkg -i, the unit, purge)"
if scripts/build_packages.sh --like-tests; then
  run_pytest "install: wheel" tests/install/test_wheel.py
  run_pytest "install: deb" tests/install/test_deb.py
else
  fail "packages"
fi

note "end"
echo
grep -v '^$' <<<"$skip_lines"
grep -v '^$' <<<"$fail_lines"
echo "times: setup:${setup_s}s ${times}total:${SECONDS}s"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
