"""node_loss_bench: a whole node lost in an elastic job (issue 34, docs/perf.md): the time from
the node's death (its agent and its workers SIGKILLed together) until the surviving nodes train
again, and how many steps they compute again. Two modes, alternating trial by trial in one run:
`regroup` (ddp-train's default: the survivors' workers run on and regroup into a world of 4) and
`restart` (--recovery restart: the survivors' workers are stopped, save, and start again from
that snapshot, as before regrouping). With --event join, a third node joins a 2-node job
instead: timed from the new node's start, and the running ranks' stall (their last step line
before the regroup or restart to their first one after).

Each trial: ddprund on loopback as the store, 3 ddprun agents (--nnodes 2:3, 2 ranks each,
ddp-train's MLP on Fashion-MNIST, a snapshot every epoch, --log-every 1 so rank 0 prints every
step); once rank 0 has printed step --kill-after of the second epoch, node 2's agent and
workers are SIGKILLed at once (the agent leads a process group of its own). Measured on
node 0's output, as it arrives: the death until its first step line after the job re-formed
(the survivors train again), and the steps between the death and the step they resumed from.
Each agent keeps ddprun's defaults (keep-alive 5 s x 3 attempts) unless --rdzv-conf is given.

Reproduce:
  scripts/loopback_only.sh python3 bench/node_loss_bench.py --bin build/bin --trials 10 \\
    --modes regroup,restart --out /tmp/node_loss.json
  (and the same with --event join --epochs 4 --out /tmp/node_join.json)
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from recovery_bench import start_store  # a fresh ddprund on an OS-chosen port

STEP = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")
RESUMED = re.compile(r"resuming from snapshot .*\(global step (\d+)\)|going on from global step (\d+)")
# The survivors' workers train again after one of these (a new start, or a regroup's heal).
AGAIN = ("resuming from snapshot", "ddp-train: mlp (", "regrouping (round")


class Agent:
    """One ddprun agent (a node): its lines with their arrival times."""

    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self.lines = []  # (monotonic time, line)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def snapshot(self):
        with self.lock:
            return list(self.lines)

    def kill_node(self):
        """The agent and its workers at once: its process group."""
        os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


def trial(args, work, n, mode):
    store, port = start_store(args.bin, work)
    snap = os.path.join(work, f"t{n}{mode}.ddp")
    argv = [os.path.join(args.bin, "ddprun"), "--nnodes=2:3", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=nl{n}{mode}",
            "--max-restarts=3", *([f"--rdzv-conf={args.rdzv_conf}"] if args.rdzv_conf else []),
            "--no-python", os.path.join(args.bin, "ddp-train"), str(args.epochs), "1",
            "--model", "mlp", "--train-subset", str(args.subset), "--threads", "1",
            "--no-eval", "--log-every", "1", "--snapshot", snap,
            *(["--recovery", "restart"] if mode == "restart" else [])]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    agents = []
    joining = args.event == "join"
    try:
        for _ in range(2 if joining else 3):
            agents.append(Agent(argv, env))
            time.sleep(0.2)
        killed_at = None  # the node's death (join: the new node's start)
        deadline = time.monotonic() + args.timeout
        while killed_at is None and time.monotonic() < deadline:
            for _, line in agents[0].snapshot():
                m = STEP.search(line)
                if m and int(m.group(1)) == 2 and int(m.group(2)) >= args.kill_after:
                    if joining:
                        killed_at = time.monotonic()
                        agents.append(Agent(argv, env))
                    else:
                        agents[2].kill_node()
                        killed_at = time.monotonic()
                    break
            time.sleep(0.005)
        if killed_at is None:
            raise RuntimeError("the kill point never came:\n" +
                               "\n".join(l for _, l in agents[0].snapshot()[-30:]))
        codes = [a.stop(args.timeout) for a in (agents if joining else agents[:2])]
        lines = agents[0].snapshot()
        text = "\n".join(l for _, l in lines)
        if set(codes) != {0}:
            raise RuntimeError(f"survivors exited {codes}:\n{text[-3000:]}")
        # The job re-formed: the first step line after the new workers' first line (or the
        # running ones' regroup).
        restart = next((i for i, (t, l) in enumerate(lines)
                        if t > killed_at and any(a in l for a in AGAIN)), None)
        # Rank 0's last step line before the death (joining: before the regroup or restart
        # took effect; the steps until then are not lost): epoch, step, steps.
        cut = restart if joining else next(
            (i for i, (t, _) in enumerate(lines) if t > killed_at), len(lines))
        before = [(t, m) for t, m in ((t, STEP.search(l)) for t, l in lines[:cut]) if m]
        last_t, last = before[-1]
        per_epoch = int(last.group(3))
        killed_global = (int(last.group(1)) - 1) * per_epoch + int(last.group(2))
        again = next((t for t, l in lines[restart or len(lines):] if STEP.search(l)), None)
        if again is None:
            raise RuntimeError("no step after the job re-formed (did it end first? more "
                               "--epochs):\n" + text[-3000:])
        resumed = [int(a or b) for a, b in RESUMED.findall(text)]
        redo = (killed_global - resumed[-1]) if resumed else None
        if again - killed_at > args.keep_log_over:  # a slow one: keep what the survivors said
            with open(os.path.join(work, f"slow-trial-{n}.log"), "w") as f:
                f.write("\n".join(f"{t - killed_at:+.3f} {l}" for t, l in
                                   agents[0].snapshot() + agents[1].snapshot()))
        return {"mode": mode, "event": args.event, "train_again_s": again - killed_at,
                "stall_s": again - last_t, "steps_redone": redo,
                "killed_at_global_step": killed_global,
                "resumed_at": resumed[-1] if resumed else None,
                "regrouped": "regrouped around its running workers" in text,
                "died_seen": "died or stopped answering" in text}
    finally:
        for a in agents:
            if a.proc.poll() is None:
                os.killpg(a.proc.pid, signal.SIGKILL)
                a.proc.wait()
        store.terminate()
        store.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--subset", type=int, default=12000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--kill-after", type=int, default=20, help="a step of the second epoch")
    p.add_argument("--rdzv-conf", default="", help="passed to every agent (liveness settings)")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--keep-log-over", type=float, default=10.0,
                   help="seconds: a slower trial's output is kept in the work folder")
    p.add_argument("--event", choices=("lose", "join"), default="lose",
                   help="lose: node 2 is SIGKILLed; join: a third node joins a 2-node job "
                        "(timed from its start)")
    p.add_argument("--modes", default="regroup,restart",
                   help="regroup (ddp-train's default), restart (--recovery restart), or both")
    p.add_argument("--out")
    args = p.parse_args()
    if not 1 <= args.trials <= 50:
        p.error("--trials must be in [1, 50]")
    modes = args.modes.split(",")
    if not modes or any(m not in ("regroup", "restart") for m in modes):
        p.error("--modes: a comma list of regroup and restart")
    work = tempfile.mkdtemp(prefix="node-loss-bench-")
    rows = []
    for n in range(args.trials):
        for mode in modes:  # alternating: the machine's drift falls on both alike
            rows.append(trial(args, work, n, mode))
            print(f"trial {n + 1}/{args.trials}: {rows[-1]}", file=sys.stderr, flush=True)
    summary = {"rdzv_conf": args.rdzv_conf or "defaults", "trials": args.trials,
               "event": args.event}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        again = [r["train_again_s"] for r in mine]
        summary[mode] = {
            "train_again_s_median": statistics.median(again), "train_again_s_min": min(again),
            "train_again_s_max": max(again),
            "stall_s_median": statistics.median(r["stall_s"] for r in mine),
            "steps_redone_median": statistics.median(
                [r["steps_redone"] for r in mine if r["steps_redone"] is not None] or [0]),
            "regrouped": sum(r["regrouped"] for r in mine)}
    if len(modes) == 2:
        summary["restart_over_regroup_median"] = (summary["restart"]["train_again_s_median"] /
                                                  summary["regroup"]["train_again_s_median"])
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "trials": rows}, f, indent=2)


if __name__ == "__main__":
    main()
