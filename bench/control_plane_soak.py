"""control_plane_soak: a 2-node x 2-worker job on a ddprund that a seeded random schedule keeps
restarting, killing and stopping (issue 32). Reports: jobs lost (goal 0), restarts caused by the
faults (goal 0), training steps lost (goal 0: a step done twice after a restart counts as
lost), and for each fault the time from the store's return to every agent saying it is back.

Jobs run back to back until --minutes pass; faults come every --every seconds (uniform in
[0.5, 1.5] x that). Each fault: SIGTERM or SIGKILL, the store started again after 0.5-5 s,
with its --data-dir or (--empty-restarts of them) an empty one; or SIGSTOP for 1-10 s.

Reproduce (the figures in docs/reliability.md):
  scripts/loopback_only.sh python3 bench/control_plane_soak.py --bin build/bin --minutes 30 \\
    --every 30 --seed 1
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

WORKER = r'''
echo "start rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT" >> "$OUT/starts"
i=0
while [ $i -lt "$STEPS" ]; do i=$((i+1)); echo $i > "$OUT/step_$RANK"; sleep 0.2; done
'''


def free_low_port():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(500):
        port = random.randrange(low - 12000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                pass
    raise SystemExit("no free port")


class Store:
    def __init__(self, binary, port, data):
        self.binary, self.port, self.data, self.proc = binary, port, data, None

    def start(self, empty=False):
        if empty:
            shutil.rmtree(self.data, ignore_errors=True)
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--http-port", "-1",
                                      "--data-dir", self.data],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise SystemExit("ddprund did not come back")


def start_job(bin_dir, port, work, n, steps):
    out = os.path.join(work, f"job{n}")
    os.makedirs(out)
    agents = []
    for node in "ab":
        err = open(os.path.join(out, f"{node}.stderr"), "w")
        agents.append((subprocess.Popen(
            [os.path.join(bin_dir, "ddprun"), "--nnodes=2", "--nproc-per-node=2",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=soak{n}",
             "--progress=off", "--rdzv-conf=join_timeout=120", "--no-python", "/bin/sh", "-c",
             WORKER], stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
            env=dict(os.environ, OUT=out, STEPS=str(steps))), err.name))
    return out, agents


def backs(agents):
    return [open(path).read().count("is back after") for _, path in agents]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--every", type=float, default=30)
    ap.add_argument("--steps", type=int, default=600, help="steps of 0.2 s per job")
    ap.add_argument("--empty-restarts", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="ddp-soak-")
    store = Store(os.path.join(a.bin, "ddprund"), free_low_port(), os.path.join(work, "data"))
    store.start()
    end = time.monotonic() + a.minutes * 60
    jobs, faults, n = [], [], 0
    job = start_job(a.bin, store.port, work, n, a.steps)
    next_fault = time.monotonic() + a.every * rng.uniform(0.5, 1.5)
    while time.monotonic() < end:
        if all(p.poll() is not None for p, _ in job[1]):
            jobs.append(job)
            n += 1
            job = start_job(a.bin, store.port, work, n, a.steps)
        if time.monotonic() < next_fault:
            time.sleep(0.1)
            continue
        kind = rng.choice(["sigterm", "sigkill", "sigstop"])
        pause = rng.uniform(1, 10) if kind == "sigstop" else rng.uniform(0.5, 5)
        before = backs(job[1])
        empty = kind != "sigstop" and rng.random() < a.empty_restarts
        if kind == "sigstop":
            store.proc.send_signal(signal.SIGSTOP)
            time.sleep(pause)
            store.proc.send_signal(signal.SIGCONT)
        else:
            store.proc.send_signal(signal.SIGTERM if kind == "sigterm" else signal.SIGKILL)
            store.proc.wait()
            time.sleep(pause)
            store.start(empty=empty)
        healed = time.monotonic()
        seen = None
        while time.monotonic() < healed + 30:
            now = backs(job[1])
            if all(x > y for x, y in zip(now, before)):
                seen = time.monotonic() - healed
                break
            if any(p.poll() is not None for p, _ in job[1]) and kind == "sigstop":
                break
            if kind == "sigstop" and time.monotonic() > healed + 3 and now == before:
                break  # a short pause nobody noticed: nothing to come back from
            time.sleep(0.05)
        faults.append({"kind": kind, "pause_s": round(pause, 2), "empty": empty,
                       "heal_to_reconnected_s": None if seen is None else round(seen, 2)})
        next_fault = time.monotonic() + a.every * rng.uniform(0.5, 1.5)
    for p, _ in job[1]:
        p.wait(timeout=a.steps * 0.2 + 400)
    jobs.append(job)
    store.proc.send_signal(signal.SIGCONT)
    store.proc.terminate()
    lost = restarts = steps_lost = 0
    for out, agents in jobs:
        lost += any(p.returncode != 0 for p, _ in agents)
        starts = open(os.path.join(out, "starts")).read().split("\n")
        redo = [s for s in starts if "restart=" in s and "restart=0" not in s]
        restarts += len(redo) // 4 if redo else 0
        steps_lost += 0 if not redo else a.steps  # a restarted sleep worker starts over
    times = [f["heal_to_reconnected_s"] for f in faults if f["heal_to_reconnected_s"] is not None]
    print(json.dumps({"minutes": a.minutes, "jobs": len(jobs), "faults": len(faults),
                      "jobs_lost": lost, "restarts": restarts, "steps_lost": steps_lost,
                      "heal_to_reconnected_s": {"n": len(times),
                                                "median": sorted(times)[len(times) // 2] if times else None,
                                                "max": max(times) if times else None},
                      "by_kind": {k: sum(f["kind"] == k for f in faults)
                                  for k in ("sigterm", "sigkill", "sigstop")},
                      "empty_restarts": sum(f["empty"] for f in faults),
                      "work": work}, indent=1))


if __name__ == "__main__":
    main()
