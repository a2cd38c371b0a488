"""fsdp_bench: training throughput of `ddp-train --sharding none|optimizer|gradients|full` under
ddprun against PyTorch FSDP2 (fully_shard, full and grad-op) and torch DDP under torchrun, the
same mlp, batch, world size and threads per rank, on the CPU over gloo.

Every configuration runs --reps times, interleaved (rep 1 of every configuration, then rep 2,
..., in an order rotated each rep), and the tables report the median samples/s (every rank's
samples per second of training, as ddp-train's --metrics-json and tests/reference/fsdp2_train.py
both measure it: from the start of the training loop to the end of rank 0's), the min-max
spread, and ratios of each ddp-train level to FSDP2 full, FSDP2 grad-op and torch DDP. A binary
without --sharding gets only the plain (`none`) row.

Reproduce (runs itself in scripts/loopback_only.sh's loopback-only namespace):
  ~/.cache/ddprun/torch-venv/bin/python bench/fsdp_bench.py --out bench/results/fsdp_bench.json
Quick look: --worlds 2 --steps 30 --reps 1. With --lock PATH every run holds flock(PATH) (a
machine shared with builds). Writes JSON (every run and the summary) to --out and prints the
markdown table.
"""
import argparse
import fcntl
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "reference", "fsdp2_train.py")
LEVELS = ("none", "optimizer", "gradients", "full")
TORCH_MODES = ("fsdp2-full", "fsdp2-grad-op", "ddp")
LABELS = {"fsdp2-full": "FSDP2 full (FULL_SHARD)", "fsdp2-grad-op": "FSDP2 grad-op (SHARD_GRAD_OP)",
          "ddp": "torch DDP"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", default=os.environ.get("DDP_BIN_DIR", os.path.join(ROOT, "build",
                                                                                   "bin")))
    p.add_argument("--python", default=sys.executable, help="the torch venv's python")
    p.add_argument("--worlds", default="2,4", help="comma-separated world sizes")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--threads", type=int, default=1, help="BLAS / torch threads per rank")
    p.add_argument("--steps", type=int, default=120, help="optimizer steps per run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    p.add_argument("--levels", default=",".join(LEVELS), help="ddp-train --sharding levels")
    p.add_argument("--torch-modes", default=",".join(TORCH_MODES))
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--lock", help="hold flock(PATH) during each run")
    p.add_argument("--out", required=True, help="JSON results")
    a = p.parse_args()
    a.worlds = [int(w) for w in a.worlds.split(",") if w]
    a.levels = [s for s in a.levels.split(",") if s]
    a.torch_modes = [m for m in a.torch_modes.split(",") if m]
    if a.reps < 1 or a.steps < 1 or not a.worlds or min(a.worlds) < 1:
        p.error("--reps, --steps and every world size must be >= 1")
    bad = set(a.levels) - set(LEVELS) | set(a.torch_modes) - set(TORCH_MODES)
    if bad:
        p.error(f"unknown levels or modes: {sorted(bad)}")
    return a


def has_sharding(train):
    p = subprocess.run([train, "--help"], capture_output=True, text=True, timeout=30)
    return "--sharding" in p.stdout + p.stderr


def epochs_for(a, world):
    """Enough epochs of the full 60000 samples for --steps steps."""
    per_epoch = (60000 + world - 1) // world
    steps_per_epoch = (per_epoch + a.batch_size - 1) // a.batch_size
    return (a.steps + steps_per_epoch - 1) // steps_per_epoch


def command(a, kind, name, world, metrics, sharding_flag):
    model = ["--hidden", str(a.hidden), "--layers", str(a.layers), "--batch-size",
             str(a.batch_size), "--threads", str(a.threads), "--optimizer", a.optimizer,
             "--max-steps", str(a.steps)]
    if kind == "ddp-train":
        train = os.path.join(a.bin_dir, "ddp-train")
        shard = ["--sharding", name] if sharding_flag else []
        return [os.path.join(a.bin_dir, "ddprun"), "--standalone", f"--nproc-per-node={world}",
                "--no-python", train, *model, *shard, "--no-eval", "--snapshot", "",
                "--metrics-json", metrics, str(epochs_for(a, world)), "0"]
    return [a.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            REFERENCE, "--mode", name, *model, "--epochs", str(epochs_for(a, world)),
            "--no-checksum", "--metrics-json", metrics]


def run_one(a, argv, metrics):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                           "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "10"
    lock = open(a.lock, "a") if a.lock else None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        t = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 15)  # the launcher we started, and its workers
            try:
                out, _ = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                out, _ = p.communicate()
            return {"error": f"timed out after {a.timeout} s", "log": out[-2000:]}
        wall = time.monotonic() - t
    finally:
        if lock:
            lock.close()
    if p.returncode != 0 or not os.path.exists(metrics):
        return {"error": f"exit {p.returncode}", "log": out[-2000:]}
    with open(metrics) as f:
        m = json.load(f)
    return {"samples_per_sec": m["samples_per_sec"], "train_seconds": m["train_seconds"],
            "steps": m["steps"], "final_loss": m["final_loss"], "wall_seconds": wall,
            "sharding": m.get("sharding", m.get("mode")), "param_types": m.get("param_types")}


def summarise(runs):
    out = {}
    for r in runs:
        if "samples_per_sec" in r:
            out.setdefault((r["world"], r["name"]), []).append(r["samples_per_sec"])
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in out.items()}


def table(a, summary, configs):
    def ratio(world, name, ref):
        if (world, ref) not in summary or (world, name) not in summary:
            return "-"
        return f"{summary[(world, name)]['median'] / summary[(world, ref)]['median']:.2f}"

    refs = [m for m in ("fsdp2-full", "fsdp2-grad-op", "ddp") if m in a.torch_modes]
    head = ["world", "run", "samples/s (median)", "min-max", "runs"] + \
           [f"x {LABELS[r].split(' (')[0]}" for r in refs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for world in a.worlds:
        for kind, name in configs:
            s = summary.get((world, name))
            label = f"ddp-train --sharding {name}" if kind == "ddp-train" else LABELS[name]
            if s is None:
                lines.append(f"| {world} | {label} | failed | | 0 |" + " |" * len(refs))
                continue
            cells = [str(world), label, f"{s['median']:.0f}", f"{s['min']:.0f}-{s['max']:.0f}",
                     str(s["n"])] + [ratio(world, name, r) for r in refs]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    a = parse_args()
    if not os.environ.get("DDP_IN_LOOPBACK_NS"):
        os.environ["DDP_IN_LOOPBACK_NS"] = "1"
        os.execv(os.path.join(ROOT, "scripts", "loopback_only.sh"),
                 [os.path.join(ROOT, "scripts", "loopback_only.sh"), sys.executable,
                  os.path.abspath(__file__), *sys.argv[1:]])
    sharding_flag = has_sharding(os.path.join(a.bin_dir, "ddp-train"))
    levels = a.levels if sharding_flag else ["none"]
    configs = [("ddp-train", s) for s in levels] + [("torch", m) for m in a.torch_modes]
    cmdline = " ".join(shlex.quote(x) for x in [sys.executable, "bench/fsdp_bench.py",
                                                 *sys.argv[1:]])
    print(f"fsdp_bench: {len(configs)} configurations x worlds {a.worlds} x {a.reps} reps, "
          f"mlp hidden {a.hidden} layers {a.layers}, batch {a.batch_size}/rank, {a.steps} steps, "
          f"{a.optimizer}, {a.threads} thread(s)/rank" +
          ("" if sharding_flag else "; this ddp-train has no --sharding: the none row only"),
          flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="fsdp-bench-") as tmp:
        for rep in range(a.reps):
            for world in a.worlds:
                k = (rep * len(a.worlds) + a.worlds.index(world)) % len(configs)
                for kind, name in configs[k:] + configs[:k]:  # rotated: no fixed position
                    metrics = os.path.join(tmp, f"{kind}-{name}-{world}-{rep}.json")
                    argv = command(a, kind, name, world, metrics, sharding_flag)
                    r = {"rep": rep, "world": world, "kind": kind, "name": name,
                         "started": time.strftime("%H:%M:%S"),
                         "binary_mtime": os.path.getmtime(argv[4] if kind == "ddp-train"
                                                          else REFERENCE),
                         **run_one(a, argv, metrics)}
                    runs.append(r)
                    got = (f"{r['samples_per_sec']:.0f} samples/s" if "samples_per_sec" in r
                           else r["error"])
                    print(f"  rep {rep + 1} world {world} {kind} {name}: {got}", flush=True)
    summary = summarise(runs)
    md = table(a, summary, configs)
    print("\n" + md + "\n\nReproduce: " + cmdline)
    result = {"command": cmdline, "config": {k: v for k, v in vars(a).items()},
              "sharding_flag": sharding_flag, "runs": runs,
              "summary": [{"world": w, "name": n, **s} for (w, n), s in sorted(summary.items())],
              "table_markdown": md}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    failed = [r for r in runs if "error" in r]
    if failed:
        print(f"fsdp_bench: {len(failed)} run(s) failed; see {a.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
