"""recovery_bench: what one rank's death costs, side by side in one run (issue 34, docs/perf.md):
ddprun with in-place recovery (ddp-train --recovery in-place), ddprun's whole-job restart from
the last snapshot (--recovery restart), and torchrun 2.x with a PyTorch DDP script that
checkpoints every epoch (bench/torch_ddp_train.py --checkpoint, the seeds' recipe).

Each trial: 2 nodes x 2 ranks on loopback (c10d), the MLP on Fashion-MNIST (--subset samples,
--epochs epochs, a snapshot every epoch); one random rank SIGKILLs itself at a random step of
the last epoch. Every variant runs the same trial once clean and once with the kill, in
alternating order; its lost time is the killed run's wall time minus the clean one's. Also:
steps computed again, bytes read from disk to recover, the survivors' stall (in-place: the
longest "healed in" of a survivor), and samples/s of the clean runs (in-place against restart:
the cost of the handshake when nothing fails).

--model convnet and --sharding LEVEL measure those (ddprun's variants only; in place, a sharded
run keeps its shard copies, so its clean samples/s against restart's is their cost).

Reproduce:
  scripts/loopback_only.sh ~/.cache/ddprun/torch-venv/bin/python bench/recovery_bench.py \\
    --bin build/bin --trials 10 --out /tmp/recovery.json
  ... add --sharding full, or --model convnet --subset 6000, for the other rows
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid):
    """Every process below `pid`, by /proc's parent links."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        kids = [c for c, pp in parent.items() if pp == todo.pop()]
        out += kids
        todo += kids
    return out


def run_pair(argv_of, env, timeout, port=None):
    """Two agents; returns (wall seconds, exit codes, their output together)."""
    port = port or free_port()
    t0 = time.monotonic()
    procs = [subprocess.Popen(argv_of(port), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                              start_new_session=True)
             for _ in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            # The agent and everything below it (torch starts each worker in a session of its
            # own, so the agent's process group is not enough).
            for pid in [*descendants(p.pid), p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            outs.append(p.communicate()[0])
    return time.monotonic() - t0, [p.returncode for p in procs], "".join(outs)


def ddprun_variant(args, work, recovery):
    def argv(kill, snap, metrics):
        def of(port):
            return [os.path.join(args.bin, "ddprun"), "--nnodes=2", "--nproc-per-node=2",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                    f"--rdzv-id=rb{port}", "--max-restarts=3", "--no-python",
                    os.path.join(args.bin, "ddp-train"), str(args.epochs), "1", "--model",
                    args.model, "--sharding", args.sharding, "--batch-size", str(args.batch),
                    "--train-subset", str(args.subset), "--threads", "1", "--no-eval",
                    "--recovery", recovery, "--snapshot", snap, "--metrics-json", metrics,
                    "--shard-copy-every", str(args.shard_copy_every)]
        return of

    def run(kill):
        snap = os.path.join(work, f"{recovery}.ddp")
        metrics = os.path.join(work, f"{recovery}.json")
        for f in (snap, metrics):
            if os.path.exists(f):
                os.remove(f)
        shutil.rmtree(snap + ".shards", ignore_errors=True)
        env = dict(os.environ)
        if kill:
            env["DDP_TRAIN_FAULT"] = f"{kill[0]}:{kill[1]}:kill"
        wall, codes, out = run_pair(argv(kill, snap, metrics), env, args.timeout)
        assert codes == [0, 0], out[-3000:]
        m = json.load(open(metrics))
        resumed = re.search(r"resuming from snapshot .*\(global step (\d+)\)", out)
        stalls = [float(x) for x in re.findall(r"ddp-train rank \d+: healed in ([0-9.e-]+) s", out)]
        return {"wall_s": wall, "samples_per_sec": m.get("samples_per_sec"),
                "resumed_at": int(resumed.group(1)) if resumed else None,
                "read_bytes": snapshot_bytes(snap, int(resumed.group(1))) if resumed else 0,
                "stall_s": max(stalls) if stalls else None,
                "dropped": len(re.findall(r"dropped, healing in place", out)) > 0}
    return run


def snapshot_bytes(path, resumed_step):
    """What a resume reads: a replicated snapshot, or a sharded one's index and every rank's
    file of that step (<path>.shards/step-<global step>/)."""
    total = os.path.getsize(path)
    folder = f"{path}.shards"
    if os.path.isdir(folder):
        # The run ends with a snapshot of its own, which replaces the step it resumed from:
        # every step's files are the same size, so the folder's one step stands for it.
        steps = sorted(os.listdir(folder))
        shards = os.path.join(folder, f"step-{resumed_step}")
        if not os.path.isdir(shards) and steps:
            shards = os.path.join(folder, steps[-1])
        total += sum(os.path.getsize(os.path.join(shards, f)) for f in os.listdir(shards))
    return total


def start_store(bin_dir, work):
    """A fresh ddprund (torch's workers leave keys no later run may see); (process, port)."""
    port_file = os.path.join(work, "ddprund.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    proc = subprocess.Popen([os.path.join(bin_dir, "ddprund"), "--port", "0", "--port-file",
                             port_file, "--http-port", "-1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not os.path.exists(port_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, int(open(port_file).read())


def torchrun_variant(args, work):
    """torchrun's agents on a ddprund of their own per run (c10d), with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. Without it torch 2.15 shares one store between the
    rendezvous and the workers across restarts and gives the workers' keys no per-attempt prefix
    (torch/distributed/rendezvous.py, env://; dynamic_rendezvous.py keeps the store of the first
    round): restarted workers find the dead attempt's Gloo addresses and fail or hang in
    init_process_group (pytorch/pytorch#135712; the agents' restart counts also differ, #108158).
    With it, worker rank 0 hosts a new store each attempt, as the issue's workaround says. With
    the store in one of the agents (torch's c10d default) the agent that hosts it may also leave
    first and the other then fails reaching it at the end, which is not what is measured here."""
    script = os.path.join(HERE, "torch_ddp_train.py")
    runs = [0]

    def run(kill):
        runs[0] += 1
        store, store_port = start_store(args.bin, work)
        ckpt = os.path.join(work, "torch.pt")
        if os.path.exists(ckpt):
            os.remove(ckpt)

        def of(port):
            return [args.python, "-m", "torch.distributed.run", "--nnodes=2",
                    "--nproc-per-node=2", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=tb{runs[0]}",
                    "--max-restarts=3", script, "--epochs", str(args.epochs), "--train-subset",
                    str(args.subset), "--checkpoint", ckpt,
                    *(["--kill-at", f"{kill[0]}:{kill[1]}"] if kill else [])]
        env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        try:
            wall, codes, out = run_pair(of, env, args.timeout, store_port)
        finally:
            store.terminate()
            store.wait()
        assert codes == [0, 0], out[-3000:]
        resumed = re.search(r"resumed from .* at epoch (\d+)", out)
        return {"wall_s": wall, "resumed_at": int(resumed.group(1)) if resumed else None,
                "read_bytes": os.path.getsize(ckpt) if resumed else 0}
    return run


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--python", default=sys.executable, help="python with torch 2.x")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--subset", type=int, default=24000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", default="mlp", choices=["mlp", "convnet"])
    p.add_argument("--sharding", default="none", choices=["none", "optimizer", "gradients", "full"],
                   help="ddp-train's --sharding (in place: with its shard copies)")
    p.add_argument("--shard-copy-every", type=int, default=1, help="ddp-train's, with --sharding")
    p.add_argument("--skip-torchrun", action="store_true",
                   help="also implied by a model or sharding the PyTorch script does not have")
    p.add_argument("--out")
    args = p.parse_args()
    if not 1 <= args.trials <= 100:
        p.error("--trials must be in [1, 100]")
    per_epoch = -(-args.subset // 4 // args.batch)  # steps per epoch, 4 ranks
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="recovery-bench-")
    variants = {"ddprun in-place": ddprun_variant(args, work, "in-place"),
                "ddprun whole-job restart": ddprun_variant(args, work, "restart")}
    if not args.skip_torchrun and args.model == "mlp" and args.sharding == "none":
        variants["torchrun 2.x, checkpoint every epoch"] = torchrun_variant(args, work)
    rows = {name: [] for name in variants}
    for t in range(args.trials):
        kill = (rng.randrange(4), per_epoch * (args.epochs - 1) + rng.randrange(per_epoch))
        order = list(variants.items())
        if t % 2:
            order.reverse()
        for name, run in order:
            if t % 2 == 0:
                clean = run(None)
                killed = run(kill)
            else:
                killed = run(kill)
                clean = run(None)
            rows[name].append({"kill": kill, "lost_s": killed["wall_s"] - clean["wall_s"],
                               "clean": clean, "killed": killed})
            print(f"trial {t + 1}/{args.trials} {name}: kill rank {kill[0]} at step {kill[1]}: "
                  f"lost {killed['wall_s'] - clean['wall_s']:.2f} s", file=sys.stderr,
                  flush=True)
    summary = {}
    for name, rs in rows.items():
        redo = []
        for r in rs:
            k = r["killed"]
            if name == "ddprun in-place":
                redo.append(1 if k.get("dropped") else 0)
            elif name.startswith("ddprun"):
                redo.append(r["kill"][1] - (k["resumed_at"] or 0))
            else:
                redo.append(r["kill"][1] - (k["resumed_at"] or 0) * per_epoch)
        summary[name] = {
            "lost_s_median": med([r["lost_s"] for r in rs]),
            "lost_s_min": min(r["lost_s"] for r in rs), "lost_s_max": max(r["lost_s"] for r in rs),
            "steps_redone_median": med(redo),
            "read_bytes_median": med([r["killed"]["read_bytes"] for r in rs]),
            "stall_s_median": med([r["killed"].get("stall_s") for r in rs]),
            "stall_s_max": max((r["killed"].get("stall_s") or 0) for r in rs),
            "clean_samples_per_sec_median": med([r["clean"].get("samples_per_sec") for r in rs]),
        }
    a, b = summary["ddprun in-place"], summary["ddprun whole-job restart"]
    summary["restart_lost_over_in_place_lost"] = (b["lost_s_median"] / a["lost_s_median"]
                                                  if a["lost_s_median"] and a["lost_s_median"] > 0
                                                  else None)
    if a["clean_samples_per_sec_median"] and b["clean_samples_per_sec_median"]:
        summary["clean_in_place_over_restart_samples_per_sec"] = (
            a["clean_samples_per_sec_median"] / b["clean_samples_per_sec_median"])
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "trials": rows, "per_epoch_steps": per_epoch}, f,
                      indent=2)


if __name__ == "__main__":
    main()
