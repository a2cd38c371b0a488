"""collectives_bench: reduce-scatter and all-gather, ddprun's communicator against torch's gloo.

Driver (default): for each world size in --nprocs and each rep, runs three sides in turn, the
same sizes, the same policy: ddp_collectives_bench under ddprun (shared memory between the
ranks, "shm"), the same with --no-shm (our gloo exchanges, "gloo"), and this file with --worker
under torchrun (torch.distributed gloo's reduce_scatter_tensor / all_gather_into_tensor). Prints
a markdown table of medians over reps and the ratios torch time / ours time (> 1: ours faster),
and writes it with the raw JSON under --results-dir. Runs in a loopback-only network namespace
(scripts/loopback_only.sh) where it can.

Worker (--worker, under torchrun): the policy of bench/collectives_bench.cpp: per op and size
(the whole tensor's bytes, even parts), a barrier, --warmup untimed calls, a calibration (k = 1,
2, 4, ... calls until k take >= --target-s / 10 on the slowest rank), then iters = clamp(target
* k / that time, 3, 100000) timed calls after a barrier; time per op is the slowest rank's time
/ iters. Rank 0 writes a JSON list to --out.

Reproduce: ~/.cache/ddprun/torch-venv/bin/python bench/collectives_bench.py (about 2 minutes
on 2 cores with the defaults).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_ITERS, MAX_ITERS = 3, 100000
OPS = ("reduce_scatter", "all_gather")


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    n = int(text[:-1] if mult > 1 else text) * mult
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive multiple of 4 bytes")
    return n


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help="the torch side, under torchrun")
    p.add_argument("--sizes", default="1M,16M,64M", help="whole-tensor bytes, K/M suffixes")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--target-s", type=float, default=0.3, help="timed seconds per op and size")
    p.add_argument("--check", action="store_true", help="verify one call per op and size first")
    p.add_argument("--out", type=Path, help="(worker) rank 0 writes the JSON list here")
    p.add_argument("--nprocs", default="2,4", help="(driver) world sizes")
    p.add_argument("--reps", type=int, default=3, help="(driver) runs of each side")
    p.add_argument("--build-dir", type=Path, default=ROOT / "build")
    p.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--timeout-s", type=float, default=120, help="(driver) per launcher run")
    args = p.parse_args()
    args.size_list = [parse_size(s) for s in args.sizes.split(",") if s]
    return args


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    results = []
    for op in OPS:
        for size in args.size_list:
            total = size // 4
            if total % n:
                print(f"collectives_bench: {size} bytes do not split into {n} equal parts",
                      file=sys.stderr)
                return 2
            whole = torch.ones(total, dtype=torch.float32)
            part = torch.ones(total // n, dtype=torch.float32)
            if op == "reduce_scatter":
                def call():
                    dist.reduce_scatter_tensor(part, whole)
            else:
                def call():
                    dist.all_gather_into_tensor(whole, part)
            if args.check:
                whole.fill_(rank + 1)
                part.fill_(rank + 1)
                call()
                if op == "reduce_scatter":
                    ok = bool((part == n * (n + 1) / 2).all())
                else:
                    want = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(total // n)
                    ok = bool((whole == want).all())
                if not ok:
                    print(f"collectives_bench: rank {rank}: {op} of {size} bytes gave wrong values",
                          file=sys.stderr)
                    return 1
            dist.barrier()
            for _ in range(args.warmup):
                call()
            k = 1
            while True:
                t0 = time.perf_counter()
                for _ in range(k):
                    call()
                took = slowest(time.perf_counter() - t0)
                if took >= args.target_s / 10 or k >= MAX_ITERS:
                    break
                k *= 2
            iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(args.target_s * k / max(took, 1e-9))))
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            per_op = slowest(time.perf_counter() - t0) / iters
            algbw = size / per_op / 1e9
            results.append({"op": op, "bytes": size, "iters": iters, "time_us": per_op * 1e6,
                            "algbw_gbps": algbw, "busbw_gbps": algbw * (n - 1) / n,
                            "world_size": n, "impl": f"torch {torch.__version__} gloo"})
            if rank == 0:
                print(f"{op:<14} {size:>10} B  {iters:>6} iters  {per_op * 1e6:>10.1f} us  "
                      f"algbw {algbw:7.3f} GB/s", file=sys.stderr, flush=True)
    if rank == 0 and args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    dist.destroy_process_group()
    return 0


def run_side(cmd, log: Path, timeout_s: float) -> bool:
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=ROOT)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # our own session: the launcher and its workers
            proc.wait()
            rc = "timeout"
    print(f"  {log.stem:<24} rc {rc}, {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return rc == 0


def fmt_size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def driver(args: argparse.Namespace) -> int:
    if not os.environ.get("DDP_IN_LOOPBACK_NS"):
        os.environ["DDP_IN_LOOPBACK_NS"] = "1"
        os.execvp("bash", ["bash", str(ROOT / "scripts" / "loopback_only.sh"), sys.executable,
                           *sys.argv])
    ddprun = args.build_dir / "bin" / "ddprun"
    bench = args.build_dir / "bin" / "ddp_collectives_bench"
    for exe in (ddprun, bench):
        if not os.access(exe, os.X_OK):
            print(f"collectives_bench: {exe} not found; build it first "
                  f"(ninja -C {args.build_dir} ddprun ddp_collectives_bench)", file=sys.stderr)
            return 2
    for v in list(os.environ):
        if v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT") or v.startswith(("PET_", "TORCHELASTIC_")):
            del os.environ[v]
    os.environ.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    out = args.results_dir / ("collectives-" + time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    common = ["--sizes", args.sizes, "--warmup", str(args.warmup), "--target-s", str(args.target_s)]
    load_before = open("/proc/loadavg").read().split()[:3]
    torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    rows = {}  # (n, side) -> list of runs (lists of dicts)
    failures = []
    nprocs = [int(x) for x in args.nprocs.split(",") if x]
    for rep in range(1, args.reps + 1):
        check = ["--check"] if rep == 1 else []
        for n in nprocs:
            sides = {
                "shm": [str(ddprun), "--standalone", f"--nproc-per-node={n}", "--no-python",
                        str(bench), *common, *check],
                "gloo": [str(ddprun), "--standalone", f"--nproc-per-node={n}", "--no-python",
                         str(bench), *common, *check, "--no-shm"],
                "torch": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                          f"--nproc-per-node={n}", str(Path(__file__).resolve()), "--worker",
                          *common, *check],
            }
            for side, cmd in sides.items():
                js = out / f"{side}-n{n}-{rep}.json"
                if run_side([*cmd, "--out", str(js)], out / f"{side}-n{n}-{rep}.log",
                            args.timeout_s) and js.exists():
                    rows.setdefault((n, side), []).append(json.loads(js.read_text()))
                else:
                    failures.append(f"{side} on {n} ranks, rep {rep} (log {side}-n{n}-{rep}.log)")

    def median_us(n, side, op, size):
        vals = [r["time_us"] for run in rows.get((n, side), []) for r in run
                if r["op"] == op and r["bytes"] == size]
        return statistics.median(vals) if vals else None

    lines = [f"Collectives benchmark {out.name}: ddprun ({args.build_dir.name}) vs torch "
             f"{torch_version} gloo, {os.cpu_count()} cores, loadavg {' '.join(load_before)} "
             f"before, {' '.join(open('/proc/loadavg').read().split()[:3])} after; "
             f"{args.reps} rep(s), OMP_NUM_THREADS=1, float32, even parts; medians of the "
             "slowest rank's time per call.", "",
             "| ranks | op | whole | ours shm | ours gloo | torch gloo | torch / shm | torch / gloo |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in nprocs:
        for op in OPS:
            for size in args.size_list:
                t = {s: median_us(n, s, op, size) for s in ("shm", "gloo", "torch")}
                cell = lambda v: f"{v / 1000:.2f} ms" if v is not None else "-"
                ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"
                lines.append(f"| {n} | {op} | {fmt_size(size)} | {cell(t['shm'])} | "
                             f"{cell(t['gloo'])} | {cell(t['torch'])} | "
                             f"{ratio(t['torch'], t['shm'])} | {ratio(t['torch'], t['gloo'])} |")
    if failures:
        lines += ["", "Failed runs: " + "; ".join(failures)]
    table = "\n".join(lines) + "\n"
    (out / "collectives.md").write_text(table)
    print(table)
    return 1 if failures else 0


def main() -> int:
    args = parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
