"""convnet_bench: `ddp-train --model convnet` against PyTorch's examples/mnist recipe
(tests/reference/mnist_convnet_reference.py) on Fashion-MNIST, one process each, the same
threads (ddp-train --threads N and OMP_NUM_THREADS=N; torch.set_num_threads(N) in the
reference), the same recipe (Adadelta at lr 1.0, StepLR gamma 0.7, batch 64), the same training
samples and epochs, evaluated on the whole test set.

Each rep runs ddp-train, then the reference (alternating which goes first each rep), and the
table reports each rep's test accuracy and training samples/s (the evaluation excluded, as both
measure it) and the medians. MNIST itself is not on these machines: the figures are on
Fashion-MNIST.

Reproduce (docs/perf.md, "MNIST convnet (issue 19)"):
  ~/.cache/ddprun/torch-venv/bin/python bench/convnet_bench.py --epochs 1 --threads 2 --reps 2 \\
      --out bench/results/convnet_bench.json
Quick look: --train-subset 4000 --reps 1. With --lock PATH every run holds flock(PATH).
"""
import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "reference", "mnist_convnet_reference.py")
FMNIST = "/usr/share/datasets/fashion-mnist"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", default=os.environ.get("DDP_BIN_DIR", os.path.join(ROOT, "build",
                                                                                   "bin")))
    p.add_argument("--python", default=sys.executable, help="the torch venv's python")
    p.add_argument("--data", default=FMNIST)
    p.add_argument("--train-subset", type=int, default=0, help="first N samples (0: all 60000)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1, help="rep r uses seed + r on both sides")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--lock", help="hold flock(PATH) during each run")
    p.add_argument("--out", help="JSON results")
    a = p.parse_args()
    if not 1 <= a.epochs <= 100 or not 1 <= a.reps <= 20 or not 1 <= a.threads <= 256 \
            or a.train_subset < 0:
        p.error("--epochs 1..100, --reps 1..20, --threads 1..256, --train-subset >= 0")
    return a


def run(argv, env, a):
    lock = open(a.lock, "w") if a.lock else None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.monotonic()
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=a.timeout)
        wall = time.monotonic() - t0
    finally:
        if lock:
            lock.close()
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout, wall


def run_ddp_train(a, seed, workdir):
    metrics = os.path.join(workdir, f"ddp-{seed}.json")
    argv = [os.path.join(a.bin_dir, "ddp-train"), "--model", "convnet", "--optimizer", "adadelta",
            "--lr", "1.0", "--lr-gamma", "0.7", "--batch-size", "64", "--device", "cpu",
            "--data", a.data, "--train-subset", str(a.train_subset), "--threads",
            str(a.threads), "--seed", str(seed), "--snapshot", "", "--metrics-json", metrics,
            str(a.epochs), "0"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = str(a.threads)
    _, wall = run(argv, env, a)
    with open(metrics) as f:
        m = json.load(f)
    return {"test_accuracy": m["test_accuracy"], "samples_per_sec": m["samples_per_sec"],
            "epoch_losses": m["epoch_losses"], "train_seconds": m["train_seconds"],
            "wall_seconds": wall}


def run_reference(a, seed):
    argv = [a.python, REFERENCE, "--data", a.data, "--train-subset", str(a.train_subset),
            "--epochs", str(a.epochs), "--threads", str(a.threads), "--seed", str(seed),
            "--lr", "1.0", "--gamma", "0.7", "--batch-size", "64"]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    out, wall = run(argv, env, a)
    r = json.loads(out.strip().splitlines()[-1])
    return {k: r[k] for k in ("test_accuracy", "samples_per_sec", "epoch_losses",
                              "train_seconds")} | {"wall_seconds": wall}


def main():
    a = parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(a.reps):
            seed = a.seed + rep
            order = ["ddp-train", "pytorch"] if rep % 2 == 0 else ["pytorch", "ddp-train"]
            for who in order:
                r = run_ddp_train(a, seed, workdir) if who == "ddp-train" else run_reference(a,
                                                                                          seed)
                r.update(who=who, rep=rep, seed=seed)
                runs.append(r)
                print(f"rep {rep} {who:9s} seed {seed}: test accuracy {r['test_accuracy']:.4f}, "
                      f"{r['samples_per_sec']:.0f} samples/s, train {r['train_seconds']:.1f} s",
                      file=sys.stderr, flush=True)
    summary = {}
    for who in ("ddp-train", "pytorch"):
        mine = [r for r in runs if r["who"] == who]
        summary[who] = {
            "test_accuracy_median": statistics.median(r["test_accuracy"] for r in mine),
            "samples_per_sec_median": statistics.median(r["samples_per_sec"] for r in mine),
        }
    samples = a.train_subset if a.train_subset > 0 else 60000
    print(f"\nFashion-MNIST, {samples} training samples x {a.epochs} epoch(s), {a.threads} "
          f"threads, {a.reps} rep(s)\n")
    print("| rep | seed | ddp-train accuracy | PyTorch accuracy | ddp-train samples/s | "
          "PyTorch samples/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rep in range(a.reps):
        d = next(r for r in runs if r["rep"] == rep and r["who"] == "ddp-train")
        t = next(r for r in runs if r["rep"] == rep and r["who"] == "pytorch")
        print(f"| {rep} | {d['seed']} | {d['test_accuracy']:.4f} | {t['test_accuracy']:.4f} | "
              f"{d['samples_per_sec']:.0f} | {t['samples_per_sec']:.0f} | "
              f"{d['samples_per_sec'] / t['samples_per_sec']:.2f} |")
    sd, st = summary["ddp-train"], summary["pytorch"]
    print(f"| median | | {sd['test_accuracy_median']:.4f} | {st['test_accuracy_median']:.4f} | "
          f"{sd['samples_per_sec_median']:.0f} | {st['samples_per_sec_median']:.0f} | "
          f"{sd['samples_per_sec_median'] / st['samples_per_sec_median']:.2f} |")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "runs": runs, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
