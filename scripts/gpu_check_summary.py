#!/usr/bin/env python3
"""The judgements of scripts/gpu_check.sh that read files, kept apart so they are tested without a
GPU (tests/scripts/test_gpu_check_summary.py):

  gpu_check_summary.py kernels BENCH_JSON
      kernel_bench --json's rows ([{"kernel", "gbps", "of_copy"}], the copy first) as one line:
      how many kernels, and the lowest share of the copy's bandwidth.
  gpu_check_summary.py bf16 FP32_JSON BF16_JSON STEPS [--falls]
      ddp-train's metrics of an fp32 and a bf16 run of the same model, data and seed: every step
      loss finite, the bf16 run's last quarter of steps within 10% of the fp32 run's (bf16 keeps
      8 bits of mantissa, not bit-equality), and with --falls its last quarter below its first.

Prints the table's detail and exits 0 when the check passed; prints why and exits 1 when not."""
import json
import math
import sys

TRACK = 0.10  # bf16 against fp32: the last quarter's mean loss, relative


def fail(msg):
    print(msg)
    sys.exit(1)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def kernels(path):
    rows = load(path)
    if not isinstance(rows, list) or len(rows) < 2 or not all(
            isinstance(r, dict) and isinstance(r.get("of_copy"), (int, float))
            and isinstance(r.get("kernel"), str) for r in rows):
        fail(f"{path}: not kernel_bench's rows (the copy, then at least one kernel)")
    low = min(rows[1:], key=lambda r: r["of_copy"])
    share, name = low["of_copy"], low["kernel"]
    return f"{len(rows) - 1} kernels; lowest {share:.0%} of copy bandwidth ({name})"


def losses(path, steps):
    got = load(path).get("step_losses")
    if not isinstance(got, list) or len(got) != steps:
        fail(f"{path}: {len(got) if isinstance(got, list) else 'no'} step losses, not {steps}")
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in got):
        fail(f"{path}: a step loss is not finite: {got[:3]} .. {got[-3:]}")
    return got


def bf16(fp32_path, bf16_path, steps, falls):
    ref, low = losses(fp32_path, steps), losses(bf16_path, steps)
    q = max(1, steps // 4)
    mean = lambda xs: sum(xs) / len(xs)
    ref_end, end, start = mean(ref[-q:]), mean(low[-q:]), mean(low[:q])
    off = abs(end - ref_end) / max(abs(ref_end), 1e-6)
    said = (f"loss {start:.4g} -> {end:.4g}, fp32 {mean(ref[:q]):.4g} -> {ref_end:.4g} "
            f"(means of {q} steps)")
    if off > TRACK:
        fail(f"{said}: bf16 ends {off:.1%} from fp32, more than {TRACK:.0%}")
    if falls and not end < start:
        fail(f"{said}: bf16 did not train (its last steps are not below its first)")
    return f"{said}, {off:.1%} apart"


def main(argv):
    if len(argv) == 2 and argv[0] == "kernels":
        print(kernels(argv[1]))
    elif len(argv) in (4, 5) and argv[0] == "bf16" and argv[3].isdigit() and (
            len(argv) == 4 or argv[4] == "--falls"):
        print(bf16(argv[1], argv[2], int(argv[3]), len(argv) == 5))
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
