"""outage_vs_torchrun: the same store faults against ddprun and torchrun 2.x, side by side
(issue 32, docs/reliability.md). Two agents x one worker rendezvous (c10d) through a ddprund;
mid-run the store is restarted (SIGTERM, SIGKILL) or stopped (SIGSTOP) and comes back after
--pause seconds. For each launcher and fault: both agents' exit codes, how many times the
workers were started (2: none restarted) and the steps the slowest rank reached.

Reproduce:
  scripts/loopback_only.sh ~/.cache/ddprun/torch-venv/bin/python bench/outage_vs_torchrun.py \\
    --bin build/bin
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

from control_plane_soak import free_low_port as low_port

WORKER = """
import os, sys, time
out, rank = os.environ["OUT"], os.environ["RANK"]
with open(os.path.join(out, "starts"), "a") as f:
    f.write(f"rank={rank} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')}\\n")
for i in range(int(os.environ["STEPS"])):
    with open(os.path.join(out, f"step_{rank}"), "w") as f:
        f.write(str(i + 1))
    time.sleep(0.2)
"""


def start_store(ddprund, port):
    p = subprocess.Popen([ddprund, "--port", str(port), "--http-port", "-1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            time.sleep(0.02)
    raise SystemExit("ddprund did not start")


def step(out, rank):
    try:
        return int(open(os.path.join(out, f"step_{rank}")).read() or 0)
    except (OSError, ValueError):
        return 0


def one(launcher, fault, a, work):
    out = tempfile.mkdtemp(dir=work)
    script = os.path.join(out, "worker.py")
    open(script, "w").write(WORKER)
    port = low_port()
    store = start_store(os.path.join(a.bin, "ddprund"), port)
    run = f"cmp{random.randrange(1 << 30)}"
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run}", "--max-restarts=3"]
    if launcher == "ddprun":
        argv = [os.path.join(a.bin, "ddprun"), *common, "--progress=off", script]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", *common, script]
    env = dict(os.environ, OUT=out, STEPS=str(a.steps), PYTHON_EXEC=sys.executable)
    agents = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env) for _ in range(2)]
    deadline = time.monotonic() + 60
    while min(step(out, 0), step(out, 1)) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    if fault == "sigstop":
        store.send_signal(signal.SIGSTOP)
        time.sleep(a.pause)
        store.send_signal(signal.SIGCONT)
    else:
        store.send_signal(signal.SIGTERM if fault == "sigterm" else signal.SIGKILL)
        store.wait()
        time.sleep(a.pause)
        store = start_store(os.path.join(a.bin, "ddprund"), port)
    codes = []
    for p in agents:
        try:
            codes.append(p.wait(timeout=a.steps * 0.2 + 120))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("hung")
    store.kill()
    starts = open(os.path.join(out, "starts")).read().count("rank=")
    return {"launcher": launcher, "fault": fault, "exit_codes": codes,
            "worker_starts": starts, "steps_reached": min(step(out, 0), step(out, 1)),
            "steps": a.steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--pause", type=float, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ddp-outage-vs-")
    rows = [one(launcher, fault, a, work) for fault in ("sigterm", "sigkill", "sigstop")
            for launcher in ("ddprun", "torchrun")]
    print("| fault | launcher | exit codes | worker starts (2: none restarted) | steps reached |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['fault']} | {r['launcher']} | {r['exit_codes']} | {r['worker_starts']} | "
              f"{r['steps_reached']} of {r['steps']} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
