"""shard_memory_bench: what rank 0 holds under ddp-train's --sharding levels, by world size.

For each world size in --nprocs and each level in --levels, runs ddp-train under ddprun
(--standalone, --no-python, a loopback-only network namespace where it can) on a deep MLP of
equal layers (default 784-1024x16-10, ~16.6M parameters) with Adam for a few steps, and reads
rank 0's --metrics-json: state_bytes_peak (the most bytes of parameters, gradients and optimizer
state held at once, gathered layers and unsharded gradient buffers included: the trainer's
exact accounting) and rss_peak_bytes (VmHWM: the process's resident peak, which also holds the
binary, the communicator's buffers and the dataset). Prints a markdown table (MiB, and each
figure's ratio to one rank's --sharding none) with the ideal of full sharding beside it: with
Adam every parameter costs 16 bytes (itself, its gradient, Adam's m and v), so 16 P / N bytes
for P parameters over N ranks. Writes the rows as JSON with --out.

Every run is one command; with --lock PATH each goes through `flock PATH` (the machine's build
lock), so a long sweep never holds the lock for more than one run.

Reproduce: python3 bench/shard_memory_bench.py --lock /tmp/ddp-build.lock --out /tmp/shard.json
(about 2 minutes of runs on 2 cores with the defaults).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("none", "optimizer", "gradients", "full")
MIB = float(1 << 20)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", default="1,2,4,8", help="world sizes")
    p.add_argument("--levels", default=",".join(LEVELS), help="--sharding levels")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=2)
    p.add_argument("--train-subset", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--build-dir", type=Path, default=ROOT / "build")
    p.add_argument("--lock", help="run each command under `flock LOCK`")
    p.add_argument("--timeout-s", type=float, default=240, help="per run")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    return p.parse_args()


def param_count(hidden, layers, inputs=784, classes=10):
    """784-H-...-H-10: `layers` hidden layers of H units, weights plus biases."""
    dims = [inputs] + [hidden] * layers + [classes]
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


def largest_layer_bytes(hidden, layers, inputs=784, classes=10):
    dims = [inputs] + [hidden] * layers + [classes]
    return 4 * max(a * b + b for a, b in zip(dims, dims[1:]))


def train_args(a, level, metrics):
    return ["--hidden", str(a.hidden), "--layers", str(a.layers), "--optimizer", "adam",
            "--train-subset", str(a.train_subset), "--batch-size", str(a.batch_size),
            "--threads", "1", "--snapshot", "", "--no-eval", "--max-steps", str(a.max_steps),
            "--sharding", level, "--metrics-json", metrics, "1", "0"]


def command(a, n, level, metrics):
    argv = [str(ROOT / "scripts" / "loopback_only.sh"), str(a.build_dir / "bin" / "ddprun"),
            "--standalone", f"--nproc-per-node={n}", "--no-python",
            str(a.build_dir / "bin" / "ddp-train"), *train_args(a, level, metrics)]
    return (["flock", a.lock] if a.lock else []) + argv


def run_one(a, n, level, tmp):
    metrics = os.path.join(tmp, f"m-{n}-{level}.json")
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="10")
    p = subprocess.run(command(a, n, level, metrics), capture_output=True, text=True,
                       timeout=a.timeout_s, env=env, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        sys.exit(f"N={n} --sharding {level}: exit {p.returncode}\n{p.stdout[-3000:]}\n"
                 f"{p.stderr[-3000:]}")
    with open(metrics) as f:
        m = json.load(f)
    assert m["sharding"] == level and m["world_size"] == n, m
    return {"nprocs": n, "sharding": level, "state_bytes_peak": m["state_bytes_peak"],
            "rss_peak_bytes": m["rss_peak_bytes"], "final_loss": m["final_loss"],
            "steps": m["steps"], "param_checksum": m["param_checksum"]}


def table(a, rows):
    p = param_count(a.hidden, a.layers)
    base = next((r for r in rows if r["nprocs"] == 1 and r["sharding"] == "none"), None)
    lines = ["| ranks | --sharding | state peak MiB | x none@1 | ideal 16P/N MiB | "
             "over ideal (layers) | RSS peak MiB | x none@1 |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    layer = largest_layer_bytes(a.hidden, a.layers)
    for r in rows:
        n, s, rss = r["nprocs"], r["state_bytes_peak"], r["rss_peak_bytes"]
        ideal, over = "-", "-"
        if r["sharding"] == "full":
            ideal = f"{16 * p / n / MIB:.1f}"
            over = f"{(s - 16 * p / n) / layer:.2f}"
        ratio = f"{s / base['state_bytes_peak']:.3f}" if base else "-"
        rss_ratio = f"{rss / base['rss_peak_bytes']:.3f}" if base else "-"
        lines.append(f"| {n} | {r['sharding']} | {s / MIB:.1f} | {ratio} | {ideal} | {over} | "
                     f"{rss / MIB:.1f} | {rss_ratio} |")
    return "\n".join(lines)


def main():
    a = parse_args()
    nprocs = [int(x) for x in a.nprocs.split(",") if x]
    levels = [x for x in a.levels.split(",") if x]
    for lv in levels:
        if lv not in LEVELS:
            sys.exit(f"unknown level {lv!r}: one of {', '.join(LEVELS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="shard-mem-") as tmp:
        for n in nprocs:
            for lv in levels:
                r = run_one(a, n, lv, tmp)
                print(f"N={n} {lv}: state {r['state_bytes_peak'] / MIB:.1f} MiB, "
                      f"RSS {r['rss_peak_bytes'] / MIB:.1f} MiB", file=sys.stderr, flush=True)
                rows.append(r)
    p = param_count(a.hidden, a.layers)
    cmd = " ".join(shlex.quote(x) for x in command(a, "N", "LEVEL", "m.json")[
        (2 if a.lock else 0):]).replace(str(ROOT) + "/", "")
    print(f"P = {p} parameters (784-{a.hidden}x{a.layers}-10), Adam: 16 P = "
          f"{16 * p / MIB:.1f} MiB; one {a.hidden}x{a.hidden} layer = "
          f"{4 * (a.hidden * a.hidden + a.hidden) / MIB:.2f} MiB\n")
    print(table(a, rows))
    print(f"\nCommand (OMP_NUM_THREADS=1): {cmd}")
    for n in nprocs:
        sums = {r["param_checksum"] for r in rows if r["nprocs"] == n}
        same = "the same at every level" if len(sums) == 1 else "DIFFERS: " + ", ".join(sums)
        print(f"N={n}: final param_checksum {same}")
    if a.out:
        a.out.write_text(json.dumps({"params": p, "hidden": a.hidden, "layers": a.layers,
                                     "max_steps": a.max_steps, "command": cmd, "rows": rows},
                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
