"""store_regression_bench: one ddprund against another, side by side in one run, with the
store benchmark's workloads (store_loadgen mix on 1/64/1024 connections and the 4096-client
storm). Used to show that a change to the server (issue 14's budgets, back-pressure and frame
deadline) costs nothing: the anchor is the ddprund of the commit before it.

Reproduce (the baseline built from the earlier commit in a worktree):
  git worktree add /tmp/ddp-base <commit> && cmake -S /tmp/ddp-base -B /tmp/ddp-base/build -G Ninja \
    && ninja -C /tmp/ddp-base/build ddprund
  scripts/loopback_only.sh python3 bench/store_regression_bench.py \
    --base /tmp/ddp-base/build/bin/ddprund --new build/bin/ddprund --loadgen build/bin/store_loadgen
Runs alternate base, new, base, new ...; each cell is the median of --reps.

The same binary with other settings: --base-args/--new-args (ddprund flags; {tmp} is a fresh
directory), e.g. the cost of the journal (issue 32):
  scripts/loopback_only.sh python3 bench/store_regression_bench.py --base build/bin/ddprund \
    --new build/bin/ddprund --new-args "--data-dir {tmp}/data" --loadgen build/bin/store_loadgen"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import tempfile
import time


def start(binary, extra=""):
    d = tempfile.mkdtemp(prefix="store-regress-")
    pf = os.path.join(d, "port")
    args = [x.replace("{tmp}", d) for x in shlex.split(extra)]
    p = subprocess.Popen([binary, "--port", "0", "--port-file", pf, *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1000):
        if os.path.exists(pf):
            return p, int(open(pf).read())
        time.sleep(0.01)
    raise SystemExit(f"{binary} did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--base-args", default="")
    ap.add_argument("--new-args", default="")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=5)
    ap.add_argument("--conns", default="1,64,1024")
    ap.add_argument("--storm", type=int, default=4096)
    a = ap.parse_args()
    servers = {"base": start(a.base, a.base_args), "new": start(a.new, a.new_args)}
    results = {}
    try:
        work = [("mix", int(c)) for c in a.conns.split(",")] + ([("storm", a.storm)] if a.storm else [])
        for kind, n in work:
            for rep in range(a.reps):
                for name in ("base", "new"):
                    proc, port = servers[name]
                    args = [a.loadgen, "--host", "127.0.0.1", "--port", str(port)]
                    if kind == "mix":
                        args += ["--mode", "mix", "--connections", str(n), "--threads", "1",
                                 "--duration-s", str(a.duration_s), "--warmup-s", "1",
                                 "--server-pid", str(proc.pid), "--seed", str(rep + 1)]
                    else:
                        args += ["--mode", "storm", "--clients", str(n), "--timeout-s", "120"]
                    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
                    d = json.loads(out.stdout.strip().splitlines()[-1])
                    results.setdefault((kind, n, name), []).append(d)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=10)
    print("| workload | base | new | new/base |")
    print("|---|---:|---:|---:|")
    for kind, n in work:
        if kind == "mix":
            b = statistics.median(r["ops_per_s"] for r in results[(kind, n, "base")])
            m = statistics.median(r["ops_per_s"] for r in results[(kind, n, "new")])
            bp = statistics.median(r["p99_us"] for r in results[(kind, n, "base")])
            mp = statistics.median(r["p99_us"] for r in results[(kind, n, "new")])
            print(f"| mix, {n} connections: ops/s (p99 µs) | {b:,.0f} ({bp:,.0f}) | "
                  f"{m:,.0f} ({mp:,.0f}) | {m / b:.3f} |")
        else:
            key = "seconds"
            b = statistics.median(r[key] for r in results[(kind, n, "base")])
            m = statistics.median(r[key] for r in results[(kind, n, "new")])
            print(f"| storm, {n} clients: {key} | {b:.3f} | {m:.3f} | {b / m:.3f} (faster > 1) |")


if __name__ == "__main__":
    main()
