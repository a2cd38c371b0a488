#!/usr/bin/env bash
# Side-by-side benchmark of ddprund against torch's own TCPStore server (libuv backend), both
# driven by store_loadgen. Each workload runs against the two servers in turn (ddprund, torch,
# ddprund, torch, ...), REPS times each; the table reports the median rep.
#
# Usage: bench/run_store_bench.sh [BUILD_DIR] [TORCH_PYTHON]
#   BUILD_DIR     has bin/ddprund and bin/store_loadgen (default: <repo>/build; not built here)
#   TORCH_PYTHON  python with torch 2.x (default: /root/.cache/ddprun/torch-venv/bin/python)
# Environment overrides (defaults in brackets):
#   REPS [3]  DURATION_S [5]  WARMUP_S [1]  CONNS ["1 64 1024"]  THREADS [1] (loadgen threads)
#   MIX [set=40,get=40,add=15,wait=5]  KEYS [1024]  VALUE_BYTES [64]
#   STORM_CLIENTS [4096] (0 skips the storm)  STORM_TIMEOUT_S [120]
#   TORCH_LISTEN [fd] (fd | torch; see torch_store_server.py)  DDPRUND_ARGS [""]
#   RESULTS_DIR [<repo>/bench/results]
# Quick run: REPS=1 DURATION_S=1 WARMUP_S=0.5 CONNS="1 64" STORM_CLIENTS=512 bench/run_store_bench.sh
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
# Everything runs in a network namespace with only loopback: no lookup of torch's can leave
# the machine, and both servers see the same quiet network.
if [[ -z "${DDP_IN_LOOPBACK_NS:-}" ]]; then
  DDP_IN_LOOPBACK_NS=1 exec "$REPO_ROOT/scripts/loopback_only.sh" "$0" "$@"
fi
BUILD_DIR=${1:-$REPO_ROOT/build}
TORCH_PY=${2:-/root/.cache/ddprun/torch-venv/bin/python}

REPS=${REPS:-3}
DURATION_S=${DURATION_S:-5}
WARMUP_S=${WARMUP_S:-1}
CONNS=${CONNS:-"1 64 1024"}
THREADS=${THREADS:-1}
MIX=${MIX:-set=40,get=40,add=15,wait=5}
KEYS=${KEYS:-1024}
VALUE_BYTES=${VALUE_BYTES:-64}
STORM_CLIENTS=${STORM_CLIENTS:-4096}
STORM_TIMEOUT_S=${STORM_TIMEOUT_S:-120}
TORCH_LISTEN=${TORCH_LISTEN:-fd}
DDPRUND_ARGS=${DDPRUND_ARGS:-}
RESULTS_DIR=${RESULTS_DIR:-$SCRIPT_DIR/results}

DDPRUND=$BUILD_DIR/bin/ddprund
LOADGEN=$BUILD_DIR/bin/store_loadgen
for exe in "$DDPRUND" "$LOADGEN"; do
  if [[ ! -x $exe ]]; then
    echo "run_store_bench: $exe not found; build it first (ninja -C $BUILD_DIR ddprund store_loadgen)" >&2
    exit 2
  fi
done
if [[ ! -x $TORCH_PY ]]; then
  echo "run_store_bench: no python at $TORCH_PY" >&2
  exit 2
fi

# One descriptor per storm client, on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Whole-run bound for the servers' own `timeout` wrappers: if this script is SIGKILLed, the
# servers still go away on their own.
n_conns=$(wc -w <<<"$CONNS")
mix_secs=$(python3 -c "print(int(($DURATION_S + $WARMUP_S + 60) * $n_conns))")
storm_secs=$((STORM_CLIENTS > 0 ? STORM_TIMEOUT_S + 30 : 0))
SERVER_LIMIT=$(((mix_secs + storm_secs) * 2 * REPS + 300))

TMP=$(mktemp -d /tmp/store_bench.XXXXXX)
SERVER_PIDS=()
cleanup() {
  local pid
  exec 3>&- 2>/dev/null || true  # torch server: stdin closes
  for pid in "${SERVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${SERVER_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${SERVER_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ddprund. fd 3 (the torch server's stdin, opened below) is closed in every other child.
# shellcheck disable=SC2086
timeout "$SERVER_LIMIT" "$DDPRUND" --host 127.0.0.1 --port 0 --port-file "$TMP/ddprund.port" \
  $DDPRUND_ARGS >"$TMP/ddprund.log" 2>&1 </dev/null &
SERVER_PIDS+=($!)

# torch's server reads stdin until EOF: feed it a FIFO that only this script holds open.
mkfifo "$TMP/torch.stdin"
exec 3<>"$TMP/torch.stdin"
timeout "$SERVER_LIMIT" "$TORCH_PY" "$SCRIPT_DIR/torch_store_server.py" --listen "$TORCH_LISTEN" \
  <"$TMP/torch.stdin" >"$TMP/torch.out" 2>"$TMP/torch.err" 3>&- &
SERVER_PIDS+=($!)

DDP_PORT=
for _ in $(seq 100); do
  [[ -s $TMP/ddprund.port ]] && DDP_PORT=$(head -n1 "$TMP/ddprund.port") && break
  sleep 0.1
done
if [[ -z $DDP_PORT ]]; then
  echo "run_store_bench: ddprund did not report a port" >&2
  cat "$TMP/ddprund.log" >&2
  exit 1
fi
TORCH_PORT=
for _ in $(seq 1200); do  # importing torch on a busy machine can take a while
  TORCH_PORT=$(awk '/^PORT /{print $2; exit}' "$TMP/torch.out" 2>/dev/null || true)
  [[ -n $TORCH_PORT ]] && break
  if ! kill -0 "${SERVER_PIDS[1]}" 2>/dev/null; then break; fi
  sleep 0.1
done
if [[ -z $TORCH_PORT ]]; then
  echo "run_store_bench: the torch server did not report a port" >&2
  cat "$TMP/torch.err" >&2
  exit 1
fi
# The servers themselves (children of their `timeout` wrappers), for CPU accounting.
child_of() { ps -o pid= --ppid "$1" | head -n1 | tr -d ' '; }
DDP_PID=$(child_of "${SERVER_PIDS[0]}")
TORCH_PID=$(child_of "${SERVER_PIDS[1]}")
TORCH_VERSION=$(timeout 120 "$TORCH_PY" -c 'import torch; print(torch.__version__)' 2>/dev/null 3>&- ||
  echo unknown)
echo "ddprund on 127.0.0.1:$DDP_PORT, torch $TORCH_VERSION TCPStore on 127.0.0.1:$TORCH_PORT" >&2

STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
RAW=$RESULTS_DIR/store_bench-$STAMP.jsonl
TABLE=$RESULTS_DIR/store_bench-$STAMP.md
: >"$RAW"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# run_one SERVER PORT WORKLOAD REP LIMIT_S LOADGEN_ARGS...: one loadgen run, one JSON line.
run_one() {
  local server=$1 port=$2 workload=$3 rep=$4 limit=$5
  shift 5
  local out rc=0
  out=$(timeout -k 5 "$limit" "$LOADGEN" --host 127.0.0.1 --port "$port" --threads "$THREADS" \
    "$@" 3>&- 2>"$TMP/loadgen.err") || rc=$?
  out=$(tail -n1 <<<"$out")
  if [[ $out != \{* ]]; then
    out="{\"error\":\"store_loadgen exited $rc without a result\",\"errors\":1}"
  fi
  python3 -c '
import json, sys
server, workload, rep, out, rc = sys.argv[1:6]
try:
    d = json.loads(out)
except ValueError:
    d = {"error": "unparsable store_loadgen output: " + out[:200], "errors": 1}
d.update(server=server, workload=workload, rep=int(rep), rc=int(rc))
print(json.dumps(d))' "$server" "$workload" "$rep" "$out" "$rc" | tee -a "$RAW" >&2
}

for c in $CONNS; do
  limit=$(python3 -c "print(int($DURATION_S + $WARMUP_S + 120))")
  for rep in $(seq "$REPS"); do
    for server in ddprund torch; do
      port=$DDP_PORT pid=$DDP_PID
      [[ $server == torch ]] && port=$TORCH_PORT pid=$TORCH_PID
      run_one "$server" "$port" "mix-$c" "$rep" "$limit" --mode mix --connections "$c" \
        --server-pid "${pid:-0}" \
        --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --mix "$MIX" --keys "$KEYS" \
        --value-bytes "$VALUE_BYTES" --seed "$rep"
    done
  done
done
if ((STORM_CLIENTS > 0)); then
  for rep in $(seq "$REPS"); do
    for server in ddprund torch; do
      port=$DDP_PORT
      [[ $server == torch ]] && port=$TORCH_PORT
      run_one "$server" "$port" "storm-$STORM_CLIENTS" "$rep" $((STORM_TIMEOUT_S + 30)) \
        --mode storm --clients "$STORM_CLIENTS" --timeout-s "$STORM_TIMEOUT_S"
    done
  done
fi

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
META_TORCH="torch $TORCH_VERSION (libuv, --listen $TORCH_LISTEN)" \
META_DDP="ddprund ${DDPRUND_ARGS:-(default options)}" \
META_HOST="$(nproc) cores; loadavg $LOAD_BEFORE before, $LOAD_AFTER after" \
META_LOAD="median of $REPS reps; mix $MIX, $KEYS keys, $VALUE_BYTES-byte values, ${DURATION_S}s after ${WARMUP_S}s warm-up; $THREADS loadgen thread(s); storm timeout ${STORM_TIMEOUT_S}s" \
  python3 - "$RAW" "$TABLE" "$STAMP" <<'EOF'
import json, os, statistics, sys
raw, table, stamp = sys.argv[1:4]
rows = [json.loads(l) for l in open(raw) if l.strip()]
workloads = list(dict.fromkeys(r["workload"] for r in rows))
env = os.environ


def runs(w, s):
    return [r for r in rows if r["workload"] == w and r["server"] == s]


def med(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None and "error" not in r]
    return statistics.median(vals) if vals else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def total(rs, key):
    return sum(r.get(key, 0) for r in rs)


lines = [
    f"Store benchmark {stamp}: {env['META_DDP']} vs {env['META_TORCH']}; {env['META_HOST']}.",
    f"{env['META_LOAD'][0].upper()}{env['META_LOAD'][1:]}.",
    "",
    "| workload | ddprund ops/s | torch ops/s | ratio | ddprund p50/p99 µs | torch p50/p99 µs "
    "| CPU µs/op: ddprund / torch / loadgen |",
    "|---|---:|---:|---:|---:|---:|---:|",
]
notes = []
for w in workloads:
    d, t = runs(w, "ddprund"), runs(w, "torch")
    for s, rs in (("ddprund", d), ("torch", t)):
        errs = total(rs, "errors")
        failed = [r["error"] for r in rs if "error" in r]
        extra = ", ".join(f"{k}={total(rs, k)}" for k in ("connect_retries", "resets") if total(rs, k))
        if errs or failed or extra:
            notes.append(f"- {w} / {s}: errors={errs}" + (f", {extra}" if extra else "")
                         + "".join(f"; {e}" for e in failed))
    if w.startswith("storm"):
        ds, ts = med(d, "seconds"), med(t, "seconds")
        ratio = f"{ts / ds:.2f}x (torch/ddprund time)" if ds and ts else "n/a"
        secs = lambda v: "n/a" if v is None else f"{v:.3f} s"
        lines.append(f"| {w} | {secs(ds)} | {secs(ts)} | {ratio} | "
                     f"connect retries {total(d, 'connect_retries')} | "
                     f"connect retries {total(t, 'connect_retries')} | |")
    else:
        do, to = med(d, "ops_per_s"), med(t, "ops_per_s")
        ratio = f"{do / to:.2f}x" if do and to else "n/a"
        lines.append(f"| {w} | {fmt(do, ',.0f')} | {fmt(to, ',.0f')} | {ratio} | "
                     f"{fmt(med(d, 'p50_us'), '.1f')} / {fmt(med(d, 'p99_us'), '.1f')} | "
                     f"{fmt(med(t, 'p50_us'), '.1f')} / {fmt(med(t, 'p99_us'), '.1f')} | "
                     f"{fmt(med(d, 'server_cpu_us_per_op'), '.2f')} / "
                     f"{fmt(med(t, 'server_cpu_us_per_op'), '.2f')} / "
                     f"{fmt(med(d + t, 'loadgen_cpu_us_per_op'), '.2f')} |")
lines += ["", "ratio: ddprund ops/s / torch ops/s (mix); storm rows give seconds to pass the barrier"
          " and torch seconds / ddprund seconds.",
          "SET has no reply: it counts as done once written, as for a torch client.",
          "CPU µs/op: user+system CPU over the measured window divided by the ops in it, for each"
          " server and for the load generator (median over both servers' runs)."]
if notes:
    lines += ["", "Errors, retries and resets (summed over reps):"] + notes
text = "\n".join(lines) + "\n"
open(table, "w").write(text)
print(text, end="")
EOF
echo "raw results: $RAW" >&2
echo "table: $TABLE" >&2
