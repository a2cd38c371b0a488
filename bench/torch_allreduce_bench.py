"""torch_allreduce_bench: torch's gloo all_reduce(SUM) on float32 CPU tensors, one process per rank.

Start it with torchrun. The same policy as bench/allreduce_bench.cpp (ddp_allreduce_bench), per
size: a barrier, --warmup untimed all-reduces, a calibration (k = 1, 2, 4, ... all-reduces until
k of them take >= --target-s / 10 on the slowest rank), then iters = clamp(--target-s * k / that
time, 5, 100000) timed all-reduces after a barrier; time per op is the slowest rank's time /
iters. algbw = bytes / time, busbw = algbw * 2(n-1)/n (the nccl-tests formula). Rank 0 writes a
JSON list, one object per size, to --out.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
MIN_ITERS, MAX_ITERS = 5, 100000


def parse_size(text: str) -> int:
    """Bytes, with an optional K or M suffix (KiB, MiB); a multiple of 4 (float32)."""
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    n = int(text[:-1] if mult > 1 else text) * mult
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive multiple of 4 bytes")
    return n


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated sizes in bytes, K/M suffixes allowed [{DEFAULT_SIZES}]")
    p.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    p.add_argument("--target-s", type=float, default=0.5, help="timed seconds per size")
    p.add_argument("--check", action="store_true",
                   help="verify one all-reduce per size (rank r sends r+1, expect n(n+1)/2)")
    p.add_argument("--out", type=Path, help="rank 0 writes the JSON list here")
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.warmup < 0 or args.target_s <= 0:
        p.error("--warmup must be >= 0 and --target-s > 0")
    return args


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for size in args.sizes:
        count = size // 4
        buf = torch.ones(count, dtype=torch.float32)
        if args.check:
            buf.fill_(rank + 1)
            dist.all_reduce(buf)
            expect = n * (n + 1) / 2
            bad = int((buf != expect).sum())
            if bad:
                print(f"torch_allreduce_bench: rank {rank}: {bad} of {count} elements != {expect} "
                      f"at {size} bytes", file=sys.stderr)
                return 1
        dist.barrier()
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        k = 1  # calibration: k = 1, 2, 4, ... ops until k take >= target/10 on the slowest rank
        while True:
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(buf)
            took = slowest(time.perf_counter() - t0)
            if took >= args.target_s / 10 or k >= MAX_ITERS:
                break
            k *= 2
        iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(args.target_s * k / max(took, 1e-9))))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        per_op = slowest(time.perf_counter() - t0) / iters
        algbw = size / per_op / 1e9
        row = {"bytes": size, "count": count, "iters": iters, "time_us": per_op * 1e6,
               "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (n - 1) / n, "world_size": n,
               "impl": f"torch {torch.__version__} gloo"}
        results.append(row)
        if rank == 0:
            print(f"{size:>10} B  {iters:>6} iters  {row['time_us']:>10.1f} us  "
                  f"algbw {algbw:7.3f} GB/s  busbw {row['busbw_gbps']:7.3f} GB/s",
                  file=sys.stderr, flush=True)
    if rank == 0 and args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
