"""lm_bench: training throughput (tokens/s) of `ddp-train --model llama` under ddprun against the
PyTorch reference (tests/reference/llama_reference.py: DTensor tensor parallelism + FSDP2) under
torchrun, on the CPU over gloo, for the meshes tp=1 (world 1), tp=2, dp=2 (world 2) and dp=2,tp=2
(world 4): the same model, initial values, batches, global batch, steps and optimizer on both
sides, one thread a rank (OMP_NUM_THREADS=1).

Every (mesh, side) runs --reps times, interleaved (rep 1 of every run, then rep 2, ..., in an
order rotated each rep); the table reports the median tokens/s (global tokens of the steps after
the first over their time, as both sides measure it), the min-max spread, the ratio
ddp-train/PyTorch, how far ddp-train's step losses are from PyTorch's, and the communication
bytes per step that ddp-train measured on its tp and dp groups against its own formula. The
global batch (--global-batch sequences) is the same at every mesh: each dp rank takes
global / dp sequences.

--long trains longer (default 2000 steps at world 1, 256 validation windows) and reports the
validation loss and perplexity of both sides against the unigram baseline (the byte
distribution of the training text), with ddp-train's validation loss after each
--epoch-steps.

Reproduce (runs itself in scripts/loopback_only.sh's loopback-only namespace):
  ~/.cache/ddprun/torch-venv/bin/python bench/lm_bench.py --lock /tmp/ddp-build.lock \
      --out bench/results/lm_bench.json
  ~/.cache/ddprun/torch-venv/bin/python bench/lm_bench.py --long --lock /tmp/ddp-build.lock \
      --out bench/results/lm_bench_long.json
Quick look: --meshes 1x1,2x2 --steps 10 --reps 1. Meshes are DxT (dp x tp). With --lock PATH
every run holds flock(PATH) (a machine shared with builds). Writes JSON (every run and the
summary) to --out and prints the markdown tables.
"""
import argparse
import fcntl
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "reference", "llama_reference.py")
SIDES = ("ddp-train", "torch")
LABELS = {"ddp-train": "ddp-train", "torch": "PyTorch"}
PROGRESS = "train loss"  # ddp-train's line after each epoch (--long prints them as they come)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", default=os.environ.get("DDP_BIN_DIR", os.path.join(ROOT, "build",
                                                                                   "bin")))
    p.add_argument("--python", default=sys.executable, help="the torch venv's python")
    p.add_argument("--long", action="store_true",
                   help="a long run that reports validation perplexity (defaults: --meshes 1x1 "
                        "--steps 2000 --reps 1 --eval-seqs 256 --epoch-steps 250)")
    p.add_argument("--meshes", help="comma-separated DxT (dp x tp); default 1x1,1x2,2x1,2x2")
    p.add_argument("--sides", default=",".join(SIDES), help="ddp-train,torch")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=16)
    p.add_argument("--ffn-hidden", type=int, default=0, help="0: LLaMA's rule")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--global-batch", type=int, default=8,
                   help="sequences per step over all dp ranks (each takes global / dp)")
    p.add_argument("--steps", type=int, help="optimizer steps per run (default 30; --long 2000)")
    p.add_argument("--reps", type=int, help="default 2; --long 1")
    p.add_argument("--sharding", choices=("none", "optimizer", "gradients", "full"),
                   default="full", help="at dp > 1")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", default="/usr/share/games/fortunes")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--eval-seqs", type=int, help="validation windows (default 16; --long 256)")
    p.add_argument("--epoch-steps", type=int,
                   help="ddp-train's steps per epoch, one validation each (default --steps; "
                        "--long 250)")
    p.add_argument("--threads", type=int, default=1, help="BLAS / torch threads per rank")
    p.add_argument("--timeout", type=int, help="seconds per run (default 300; --long 3600)")
    p.add_argument("--lock", help="hold flock(PATH) during each run")
    p.add_argument("--out", required=True, help="JSON results")
    a = p.parse_args()
    long_defaults = {"meshes": "1x1", "steps": 2000, "reps": 1, "eval_seqs": 256,
                     "epoch_steps": 250, "timeout": 3600}
    short_defaults = {"meshes": "1x1,1x2,2x1,2x2", "steps": 30, "reps": 2, "eval_seqs": 16,
                      "epoch_steps": None, "timeout": 300}
    for k, v in (long_defaults if a.long else short_defaults).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.epoch_steps is None:
        a.epoch_steps = a.steps
    try:
        a.meshes = [tuple(int(x) for x in m.split("x")) for m in a.meshes.split(",") if m]
    except ValueError:
        p.error(f"--meshes {a.meshes}: expected DxT,DxT,... (e.g. 1x1,2x2)")
    a.sides = [s for s in a.sides.split(",") if s]
    if set(a.sides) - set(SIDES) or not a.sides:
        p.error(f"--sides: a comma-separated subset of {','.join(SIDES)}")
    if a.reps < 1 or a.steps < 2 or a.epoch_steps < 1 or not a.meshes or \
            any(len(m) != 2 or min(m) < 1 for m in a.meshes):
        p.error("--reps and --epoch-steps must be >= 1, --steps >= 2, meshes DxT with D, T >= 1")
    bad = [d for d, _ in a.meshes if a.global_batch % d]
    if bad:
        p.error(f"--global-batch {a.global_batch} must split over dp = {bad}")
    return a


def mesh_name(dp, tp):
    if dp == 1:
        return f"tp={tp}"
    return f"dp={dp}" if tp == 1 else f"dp={dp},tp={tp}"


def model_flags(a):
    f = ["--dim", str(a.dim), "--n-layers", str(a.n_layers), "--n-heads", str(a.n_heads),
         "--seq-len", str(a.seq_len)]
    if a.ffn_hidden:
        f += ["--ffn-hidden", str(a.ffn_hidden)]
    if a.tie_embeddings:
        f.append("--tie-embeddings")
    return f


def command(a, side, dp, tp, out):
    world = dp * tp
    common = [*model_flags(a), "--mesh", f"dp={dp},tp={tp}", "--batch-size",
              str(a.global_batch // dp), "--optimizer", a.optimizer, "--lr", str(a.lr),
              "--weight-decay", str(a.weight_decay), "--seed", str(a.seed), "--text", a.text,
              "--val-fraction", str(a.val_fraction), "--eval-seqs", str(a.eval_seqs),
              "--threads", str(a.threads)]
    if dp > 1:
        common += ["--sharding", a.sharding]
    if side == "ddp-train":
        epochs = (a.steps + a.epoch_steps - 1) // a.epoch_steps
        return [os.path.join(a.bin_dir, "ddprun"), "--standalone", f"--nproc-per-node={world}",
                "--no-python", os.path.join(a.bin_dir, "ddp-train"), str(epochs), "0",
                "--model", "llama", *common, "--epoch-steps", str(a.epoch_steps),
                "--max-steps", str(a.steps), "--snapshot", "", "--metrics-json", out]
    return [a.python, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", REFERENCE, *common, "--steps", str(a.steps),
            "--out", out]


def normalise(side, m):
    """The figures both sides report, under one set of names."""
    if side == "ddp-train":
        fp = m.get("fingerprint") or [None, None]
        return {"tokens_per_s": m.get("tokens_per_s"), "step_losses": m.get("step_losses", []),
                "val_loss": m.get("val_loss"), "val_losses": m.get("val_losses"),
                "unigram_val_loss": m.get("unigram_val_loss"), "params": m.get("params"),
                "param_sum": fp[0], "param_sumsq": fp[1], "comm": m.get("comm"),
                "mesh": m.get("mesh")}
    return {"tokens_per_s": m.get("tokens_per_sec"), "step_losses": m.get("step_losses", []),
            "val_loss": m.get("val_loss"), "unigram_val_loss": m.get("unigram_baseline"),
            "params": m.get("params"), "param_sum": m.get("param_sum"),
            "param_sumsq": m.get("param_sumsq"), "mesh": m.get("mesh"),
            "elapsed_seconds": m.get("elapsed_seconds")}


def run_one(a, side, argv, out):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                           "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "10"
    lock = open(a.lock, "a") if a.lock else None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        # What ran: taken once the lock is held (a build may replace the binary while we wait).
        binary = argv[4] if side == "ddp-train" else REFERENCE
        ran = {"started": time.strftime("%H:%M:%S"),
               "binary_mtime": os.path.getmtime(binary) if os.path.exists(binary) else None}
        t = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
        expired = threading.Event()

        def kill(sig):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

        def stop():  # at the time limit: the launcher we started, and its workers
            expired.set()
            kill(signal.SIGTERM)
            threading.Timer(20, kill, (signal.SIGKILL,)).start()

        timer = threading.Timer(a.timeout, stop)
        timer.start()
        lines = []
        for line in p.stdout:  # --long: each epoch's line as it comes
            lines.append(line)
            if a.long and PROGRESS in line:
                print("    " + line.rstrip(), flush=True)
        p.wait()
        timer.cancel()
        log = "".join(lines)
        if expired.is_set():
            return {**ran, "error": f"timed out after {a.timeout} s", "log": log[-3000:]}
        wall = time.monotonic() - t
    finally:
        if lock:
            lock.close()
    if p.returncode != 0 or not os.path.exists(out):
        return {**ran, "error": f"exit {p.returncode}", "log": log[-3000:]}
    with open(out) as f:
        m = json.load(f)
    r = {**ran, **normalise(side, m), "wall_seconds": wall}
    if side == "ddp-train":
        r["mesh_line"] = next((ln for ln in log.splitlines() if "ddp-train: mesh" in ln), None)
    if r["tokens_per_s"] is None:
        r["error"] = "no tokens/s in the metrics"
        r["log"] = log[-3000:]
    return r


def loss_gap(ours, ref):
    """max over steps of |ddp-train - PyTorch| / |PyTorch| (None when either has no losses)."""
    n = min(len(ours), len(ref))
    if n == 0:
        return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(ours[:n], ref[:n]))


def fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def summarise(a, runs):
    out = {}
    for dp, tp in a.meshes:
        row = {"mesh": mesh_name(dp, tp), "dp": dp, "tp": tp, "world": dp * tp}
        for side in a.sides:
            ok = [r for r in runs if (r["dp"], r["tp"], r["side"]) == (dp, tp, side)
                  and "error" not in r]
            v = [r["tokens_per_s"] for r in ok]
            row[side] = ({"median": statistics.median(v), "min": min(v), "max": max(v),
                          "n": len(v)} if v else None)
            if ok:
                last = ok[-1]
                row[side].update({k: last.get(k) for k in
                                  ("val_loss", "unigram_val_loss", "val_losses", "param_sum",
                                   "param_sumsq", "params", "comm", "mesh_line")
                                  if k in last})
                row[side]["final_loss"] = last["step_losses"][-1] if last["step_losses"] \
                    else None
        if row.get("ddp-train") and row.get("torch"):
            row["ratio"] = row["ddp-train"]["median"] / row["torch"]["median"]
            pairs = [(o, t) for o in runs for t in runs
                     if (o["dp"], o["tp"], o["side"], t["dp"], t["tp"], t["side"]) ==
                     (dp, tp, "ddp-train", dp, tp, "torch") and o["rep"] == t["rep"]
                     and "error" not in o and "error" not in t]
            gaps = [g for o, t in pairs if (g := loss_gap(o["step_losses"],
                                                          t["step_losses"])) is not None]
            row["max_rel_loss_gap"] = max(gaps) if gaps else None
        out[(dp, tp)] = row
    return out


def comm_cell(comm, group, key):
    try:
        return fmt(comm[group][key], ",.0f")
    except (KeyError, TypeError):
        return "-"


def speed_table(a, summary):
    head = ["mesh", "world"]
    for side in a.sides:
        head += [f"{LABELS[side]} tokens/s", "min-max"]
    if len(a.sides) == 2:
        head += ["ddp-train / PyTorch", "max rel. step-loss gap"]
    lines = ["| " + " | ".join(head) + " |",
             "|---|---:|" + "---:|" * (len(head) - 2)]
    for (dp, tp), row in summary.items():
        cells = [row["mesh"], str(row["world"])]
        for side in a.sides:
            s = row.get(side)
            cells += ([f"{s['median']:.0f}", f"{s['min']:.0f}-{s['max']:.0f}"] if s
                      else ["failed", ""])
        if len(a.sides) == 2:
            cells += [fmt(row.get("ratio"), ".2f"), fmt(row.get("max_rel_loss_gap"), ".1e")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comm_table(summary):
    lines = ["| mesh | tp bytes/step measured | tp formula | dp bytes/step measured | dp formula |",
             "|---|---:|---:|---:|---:|"]
    for row in summary.values():
        comm = (row.get("ddp-train") or {}).get("comm")
        lines.append(f"| {row['mesh']} | {comm_cell(comm, 'tp', 'measured_bytes_per_step')} | "
                     f"{comm_cell(comm, 'tp', 'formula_bytes_per_step')} | "
                     f"{comm_cell(comm, 'dp', 'measured_bytes_per_step')} | "
                     f"{comm_cell(comm, 'dp', 'formula_bytes_per_step')} |")
    return "\n".join(lines)


def ppl(loss):
    return None if loss is None else math.exp(loss)


def quality_table(a, summary):
    lines = ["| mesh | side | steps | final train loss | val loss | val ppl | unigram val loss | "
             "unigram ppl | ppl / unigram ppl |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in summary.values():
        for side in a.sides:
            s = row.get(side)
            if not s:
                lines.append(f"| {row['mesh']} | {LABELS[side]} | failed |" + " |" * 6)
                continue
            vp, up = ppl(s.get("val_loss")), ppl(s.get("unigram_val_loss"))
            lines.append(f"| {row['mesh']} | {LABELS[side]} | {a.steps} | "
                         f"{fmt(s.get('final_loss'), '.3f')} | {fmt(s.get('val_loss'), '.3f')} | "
                         f"{fmt(vp, '.2f')} | {fmt(s.get('unigram_val_loss'), '.3f')} | "
                         f"{fmt(up, '.2f')} | "
                         f"{fmt(vp / up if vp and up else None, '.3f')} |")
    return "\n".join(lines)


def main():
    a = parse_args()
    if not os.environ.get("DDP_IN_LOOPBACK_NS"):
        os.environ["DDP_IN_LOOPBACK_NS"] = "1"
        os.execv(os.path.join(ROOT, "scripts", "loopback_only.sh"),
                 [os.path.join(ROOT, "scripts", "loopback_only.sh"), sys.executable,
                  os.path.abspath(__file__), *sys.argv[1:]])
    configs = [(dp, tp, side) for dp, tp in a.meshes for side in a.sides]
    cmdline = " ".join(shlex.quote(x) for x in [sys.executable, "bench/lm_bench.py",
                                                 *sys.argv[1:]])
    print(f"lm_bench: meshes {', '.join(mesh_name(d, t) for d, t in a.meshes)} x "
          f"{'/'.join(a.sides)} x {a.reps} reps; llama dim {a.dim} layers {a.n_layers} heads "
          f"{a.n_heads} seq {a.seq_len}{' tied' if a.tie_embeddings else ''}, global batch "
          f"{a.global_batch} x {a.seq_len} tokens, {a.steps} steps, {a.optimizer} lr {a.lr}, "
          f"sharding {a.sharding} at dp > 1, {a.threads} thread(s)/rank", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="lm-bench-") as tmp:
        for rep in range(a.reps):
            k = rep % len(configs)
            for dp, tp, side in configs[k:] + configs[:k]:  # rotated: no fixed position
                out = os.path.join(tmp, f"{side}-{dp}x{tp}-{rep}.json")
                argv = command(a, side, dp, tp, out)
                r = {"rep": rep, "dp": dp, "tp": tp, "side": side, "argv": argv,
                     **run_one(a, side, argv, out)}
                runs.append(r)
                got = (f"{r['tokens_per_s']:.0f} tokens/s, final loss {r['step_losses'][-1]:.4f}"
                       if "error" not in r else r["error"])
                print(f"  rep {rep + 1} {mesh_name(dp, tp)} {side}: {got}", flush=True)
                if "error" in r:
                    print("    " + r["log"][-1200:].replace("\n", "\n    "), flush=True)
    builds = {r.get("binary_mtime") for r in runs if r["side"] == "ddp-train"}
    if len(builds) > 1:
        print(f"lm_bench: ddp-train was rebuilt during the bench ({len(builds)} builds ran; "
              "binary_mtime in the JSON says which run used which)", flush=True)
    summary = summarise(a, runs)
    tables = {"speed": speed_table(a, summary)}
    if "ddp-train" in a.sides:
        tables["comm"] = comm_table(summary)
    if a.long:
        tables["quality"] = quality_table(a, summary)
    print()
    for md in tables.values():
        print(md + "\n")
    if a.long and "ddp-train" in a.sides:
        for row in summary.values():
            vl = (row.get("ddp-train") or {}).get("val_losses")
            if vl:
                print(f"ddp-train {row['mesh']} val loss every {a.epoch_steps} steps: " +
                      ", ".join(f"{v:.3f}" for v in vl))
    lines = {r.get("mesh_line") for r in runs if r.get("mesh_line")}
    for ln in sorted(lines):
        print(ln)
    print("\nReproduce: " + cmdline)
    result = {"command": cmdline, "config": vars(a), "runs": runs,
              "summary": [{k: v for k, v in row.items()} for row in summary.values()],
              "tables_markdown": tables}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    failed = [r for r in runs if "error" in r]
    if failed:
        print(f"lm_bench: {len(failed)} run(s) failed; see {a.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
