"""The agent's memory for the metric histories over a long run (issue 36; docs/perf.md, "Metrics
on the live page"). Two ddprun agents side by side in one run, each --standalone with 8 workers
that write progress lines as fast as a loop allows (a step every millisecond): one with 16
metrics on every line (the most a rank keeps), one with none. The agents' VmRSS is sampled every
2 s, and the histories' own size as the agent publishes it (history_bytes in its record, read
with `ddprun status --json` every 10 s); the figures are that size over time, the RSS growth
from the 10th second to the end, and the RSS difference between the two agents at the end.
The bound: 8 ranks x 17 series (16 metrics and samples/s) x 512 points x 24 bytes = 1.6 MiB
(metric_history.hpp), reached once the series are full; then they halve and stay there.
Usage: scripts/loopback_only.sh python3 bench/status_history_bench.py [--bin build/bin]
         [--seconds 300] [--ranks 8] [--out bench/results/status_history_bench.json]"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORKER = """
import os, sys, time
fd = int(os.environ["DDPRUN_PROGRESS_FD"])
n, until = int(sys.argv[1]), time.time() + float(sys.argv[2])
step = 0
while time.time() < until:
    step += 1
    extra = "".join(f" m{i}={step * 0.001 + i:.6g}" for i in range(n))
    try:
        os.write(fd, f"step={step} samples=32{extra}\\n".encode())
    except BlockingIOError:
        pass
    time.sleep(0.001)
"""


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/status_history_bench.json"))
    a = ap.parse_args()
    if not 10 < a.seconds <= 3600 or not 1 <= a.ranks <= 64:
        raise SystemExit("status_history_bench: --seconds in (10, 3600], --ranks in [1, 64]")
    work = tempfile.mkdtemp(prefix="history-bench-")
    script = os.path.join(work, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    agents = {}
    for name, n in (("metrics", 16), ("none", 0)):
        agents[name] = subprocess.Popen(
            [os.path.join(a.bin, "ddprun"), "--standalone", f"--nproc-per-node={a.ranks}",
             "--progress=off", sys.executable, script, str(n), str(a.seconds)],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, name + ".log"), "w"),
            env=env, start_new_session=True)
    samples = {name: [] for name in agents}
    history = []  # (seconds, history_bytes) of the agent with metrics
    t0 = time.time()
    where = None
    try:
        while all(p.poll() is None for p in agents.values()):
            for name, p in agents.items():
                try:
                    samples[name].append((round(time.time() - t0, 1), vm_rss_kib(p.pid)))
                except OSError:
                    pass
            if where is None:
                m = re.search(r"rendezvous store on (\S+) \(run id ([^);]+)",
                              open(os.path.join(work, "metrics.log")).read())
                where = m.groups() if m else None
            if where and len(samples["metrics"]) % 5 == 1:
                st = subprocess.run([os.path.join(a.bin, "ddprun"), "status", "--rdzv-endpoint",
                                     where[0], "--run-id", where[1], "--json"],
                                    capture_output=True, text=True, timeout=30, env=env)
                if st.returncode == 0:
                    nodes = json.loads(st.stdout)["nodes"]
                    history.append((round(time.time() - t0, 1),
                                    sum(n.get("history_bytes", 0) for n in nodes)))
            time.sleep(2)
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=60)
    # 17 series a rank of 512 points, plus each series's own bookkeeping (MetricHistory::bytes)
    res = {"seconds": a.seconds, "ranks": a.ranks,
           "bound_kib": a.ranks * 17 * (512 * 24 + 128) // 1024}
    for name, pts in samples.items():
        at10 = next((kib for t, kib in pts if t >= 10), pts[0][1])
        last = pts[-2][1] if len(pts) > 1 else pts[-1][1]  # the last sample before exit
        res[name] = {"rss_kib_at_10s": at10, "rss_kib_at_end": last,
                     "growth_kib": last - at10, "samples": pts}
    res["history_cost_kib"] = res["metrics"]["rss_kib_at_end"] - res["none"]["rss_kib_at_end"]
    res["history_bytes"] = history
    res["history_kib_max"] = max((b for _, b in history), default=0) // 1024
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for name in ("metrics", "none"):
        r = res[name]
        print(f"{name:>8}: agent RSS {r['rss_kib_at_10s']} KiB at 10 s, {r['rss_kib_at_end']} KiB "
              f"at {a.seconds:.0f} s (growth {r['growth_kib']} KiB)")
    print(f"RSS difference at the end: {res['history_cost_kib']} KiB")
    print(f"histories as published: {[(t, b // 1024) for t, b in history]} KiB; "
          f"max {res['history_kib_max']} KiB (bound {res['bound_kib']} KiB)")


if __name__ == "__main__":
    main()
